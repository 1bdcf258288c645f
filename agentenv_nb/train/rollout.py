"""Play a model through ``environment_factory`` environments the way TRL's GRPOTrainer does, and keep each
conversation: for greedy evals outside the trainer (before and after SFT, after GRPO) and self-distillation's rollouts.
A model loaded with Unsloth's colocated vLLM (``fast_inference``) generates there, from its current LoRA weights;
any other with transformers' ``generate`` (``generator``).

    rollouts = play(model, tokenizer, env.factory, env.dataset_for("eval"), max_new_tokens=256)
    summary(rollouts)   # {"reward": ..., "tool_calls": ..., "unscored": ...}
    greedy_evals(run_dir, {"after SFT": summary(rollouts)})   # the run's greedy evals, a column a stage

The rules are TRL's: an environment's tools are its public methods but ``reset`` and ``get_reward``; ``reset``
gets the whole row, and a string it returns is appended to the last prompt message; the model gets at most
``max_tool_calling_iterations`` rounds of tool results; a failing tool call answers ``{"error": ...}``.
"""

from __future__ import annotations

import functools
import inspect
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

from agentenv_nb.client.tools import RESERVED
from agentenv_nb.library_log import to_log
from agentenv_nb.stack import import_unsloth

GREEDY_EVALS = "greedy-evals.csv"  # in RUN_DIR: the greedy eval before and after SFT (notebook 02), after GRPO (03)
STAGES = ("before SFT", "after SFT", "after GRPO")  # the greedy evals' columns, in a run's order


class Rollout(TypedDict):
    """One played task: the conversation the model had, the tools it saw, and what the env made of it."""

    task_id: str
    messages: list[dict]
    tools: list[dict]
    reward: float | None
    tool_calls: int
    tool_failures: int


def tool_methods(environment: Any) -> list[Callable]:
    """The environment's tools, as TRL lists them: its class's public functions but reset and get_reward."""
    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), inspect.isfunction)
            if not name.startswith("_") and name not in RESERVED]


# Environments by class, made once and reset for every rollout, as TRL pools them: each may hold a server session.
_POOLS: dict[type, list[Any]] = {}


def play(model: Any, tokenizer: Any, factory: Callable | dict[str, Callable], rows: Iterable[dict], *,
         max_tool_calling_iterations: int = 2, max_new_tokens: int = 256, temperature: float = 0.0,
         batch_size: int = 8, chat_template_kwargs: dict | None = None, progress: bool = True) -> list[Rollout]:
    """Play every row's task with ``model``, ``batch_size`` rollouts at a time (greedy at temperature 0), on the
    engine ``generator`` picks, showing how many are done and the time left (``progress``)."""
    import_unsloth()  # before trl, so Unsloth patches it first
    from trl.chat_template_utils import add_response_schema, get_training_chat_template

    from agentenv_nb.train.progress import Progress

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)  # as TRL's GRPOTrainer does: a parser of its own (a built template's) is kept
    # Rendered as TRL's trainers render a conversation (its prefix-preserving training template, where it has one),
    # so a model sees here what it was fine-tuned on and what GRPO will show it.
    template_kwargs = {"enable_thinking": False, "chat_template": get_training_chat_template(tokenizer),
                       **(chat_template_kwargs or {})}
    rows, rollouts, training = list(rows), [], model.training
    shown = Progress("played", len(rows), "tasks") if progress and len(rows) > 1 else None
    model.eval()  # generation with the KV cache, which gradient checkpointing turns off while training
    # What the libraries say meanwhile goes to the library log: a colocated vLLM watches every Triton kernel compiled
    # after its warm-up, and warns on stderr of each one (Unsloth's inference kernels in generate), and notes each LoRA
    # it is handed
    try:
        with to_log(f"playing {len(rows)} task(s)", keep_displays=True):  # the progress line
            if shown:
                shown.update(0)
            for start in range(0, len(rows), batch_size):
                batch = rows[start:start + batch_size]
                classes = [factory[row["environment"]] if isinstance(factory, dict) else factory for row in batch]
                environments = [environment_for(cls, classes[:i].count(cls)) for i, cls in enumerate(classes)]
                rollouts += _play_batch(model, tokenizer, environments, batch, max_tool_calling_iterations,
                                        dict(max_new_tokens=max_new_tokens, temperature=temperature), template_kwargs)
                if shown:
                    shown.update(len(rollouts))
    finally:
        model.train(training)
    return rollouts


def generator(model: Any) -> str:
    """The engine ``play`` generates ``model``'s replies on: "vllm" where it was loaded with Unsloth's colocated
    vLLM (``fast_inference=True``: it has a ``vllm_engine``), else "transformers" (``generate``)."""
    return "vllm" if getattr(model, "vllm_engine", None) is not None else "transformers"


def environment_for(cls: Callable, slot: int) -> Any:
    """The ``slot``-th pooled environment of ``cls``, made when the pool is smaller."""
    pool = _POOLS.setdefault(cls, [])
    while len(pool) <= slot:
        pool.append(cls())
    return pool[slot]


def _play_batch(model, tokenizer, environments, rows, iterations, sampling, template_kwargs) -> list[Rollout]:
    from transformers.utils import get_json_schema

    rollouts: list[Rollout] = []
    for environment, row in zip(environments, rows):
        messages = [dict(message) for message in row["prompt"]]
        observation = environment.reset(**{k: v for k, v in row.items() if k != "environment"})
        if isinstance(observation, str):
            messages[-1]["content"] += observation
        tools = tool_methods(environment)
        rollouts.append(Rollout(task_id=row.get("task_id", ""), messages=messages,
                                tools=[get_json_schema(tool) for tool in tools], reward=None, tool_calls=0,
                                tool_failures=0))
    active = list(range(len(rows)))
    for iteration in range(iterations + 1):
        replies = _generate(model, tokenizer, [rollouts[i] for i in active], sampling, template_kwargs)
        still = []
        for i, reply in zip(active, replies):
            rollouts[i]["messages"].append(reply)
            if reply.get("tool_calls") and iteration < iterations:
                call_tools(environments[i], reply["tool_calls"], rollouts[i])
                still.append(i)
        active = still
        if not active:
            break
    for environment, rollout in zip(environments, rollouts):
        rollout["reward"] = environment.get_reward()
    return rollouts


def _generate(model, tokenizer, rollouts, sampling, template_kwargs) -> list[dict]:
    """One reply for each rollout's conversation so far, generated as one batch on ``generator(model)``'s engine,
    cut at the first stop token and parsed into a message by TRL."""
    from trl.chat_template_utils import parse_response

    prompts = [tokenizer.apply_chat_template(r["messages"], tools=r["tools"], add_generation_prompt=True,
                                             tokenize=False, **template_kwargs) for r in rollouts]
    prompts_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    stops = stop_ids(model, tokenizer)
    generate = _on_vllm if generator(model) == "vllm" else _on_transformers
    return [parse_response(tokenizer, _until_stop(ids, stops), prefix=prefix)
            for ids, prefix in zip(generate(model, tokenizer, prompts_ids, sampling, stops), prompts_ids)]


def stop_ids(model, tokenizer) -> set[int]:
    """The tokens a reply ends at: the tokenizer's EOS and PAD, and every EOS of the model's generation config
    (those transformers' ``generate`` stops at)."""
    ends = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ends = [ends] if isinstance(ends, int) else list(ends or ())
    return {token for token in (tokenizer.pad_token_id, tokenizer.eos_token_id, *ends) if token is not None}


def _on_transformers(model, tokenizer, prompts_ids, sampling, stops) -> list[list[int]]:
    """The generated ids of each prompt, from transformers' ``generate`` on one left-padded batch."""
    import torch

    inputs = tokenizer.pad({"input_ids": prompts_ids}, padding_side="left", return_tensors="pt").to(model.device)
    greedy = sampling["temperature"] <= 0
    with torch.no_grad():
        # max_length=None: Unsloth sets the model's generation_config.max_length to its sequence length, and
        # transformers warns at every call where both are set
        output = model.generate(**inputs, max_new_tokens=sampling["max_new_tokens"], max_length=None,
                                do_sample=not greedy,
                                temperature=None if greedy else sampling["temperature"],
                                pad_token_id=tokenizer.pad_token_id)
    return output[:, inputs["input_ids"].shape[1]:].tolist()


@functools.cache
def _lora_folder() -> str:
    """This process's own folder for the adapter config Unsloth's ``load_lora`` writes beside the tensors it hands
    vLLM (made private, so no one else's file reaches vLLM)."""
    return tempfile.mkdtemp(prefix="agentenv_nb-lora-")


def _on_vllm(model, tokenizer, prompts_ids, sampling, stops) -> list[list[int]]:
    """The generated ids of each prompt, from the model's colocated vLLM engine and its CURRENT LoRA weights: vLLM
    holds the base weights only, and Unsloth's ``load_lora(..., load_tensors=True)`` makes a LoRA request of the
    adapter's tensors as they are now, as Unsloth's GRPOTrainer does before each generation. It stops where
    transformers' ``generate`` would (``stops``, not vLLM's own EOS list), samples as it would (the model's
    generation config's top-k and top-p), and is greedy at temperature 0."""
    from vllm import SamplingParams

    greedy = sampling["temperature"] <= 0
    config = model.generation_config
    drawn = {} if greedy else {"top_k": config.top_k or 0, "top_p": config.top_p or 1.0}
    params = SamplingParams(temperature=0.0 if greedy else sampling["temperature"], **drawn,
                            max_tokens=sampling["max_new_tokens"], ignore_eos=True, stop_token_ids=sorted(stops),
                            detokenize=False)  # parse_response decodes the ids
    lora = model.load_lora(_lora_folder(), load_tensors=True) if hasattr(model, "peft_config") else None
    outputs = model.fast_generate([{"prompt_token_ids": ids} for ids in prompts_ids], sampling_params=params,
                                  lora_request=lora, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def _until_stop(ids: list[int], stops: set[int]) -> list[int]:
    """The generated ids up to and including the first stop token, without the padding after it."""
    for position, token in enumerate(ids):
        if token in stops:
            return ids[:position + 1]
    return ids


def call_tools(environment: Any, calls: list[dict], rollout: Rollout) -> None:
    """Run each tool call on the environment and append its result as a tool message, as TRL does."""
    tools = {tool.__name__: tool for tool in tool_methods(environment)}
    for call in calls:
        rollout["tool_calls"] += 1
        name = call.get("function", {}).get("name", "unknown")
        try:
            if call.get("type") != "function" or name not in tools:
                raise ValueError(f"Tool {name} not found.")
            result: Any = str(tools[name](**call["function"].get("arguments", {})))
        except Exception as e:  # the model's bad call is the model's to see, as in TRL
            rollout["tool_failures"] += 1
            result = str({"error": str(e)})
        rollout["messages"].append({"role": "tool", "name": name, "content": result})


def summary(rollouts: list[Rollout]) -> dict[str, float]:
    """Mean reward of the scored rollouts and its spread (standard deviation), tool calls a rollout, and the share
    of tool-calling and unscored ones."""
    import statistics

    scored = [r["reward"] for r in rollouts if r["reward"] is not None]
    return {"reward": statistics.fmean(scored) if scored else float("nan"),
            "reward_std": statistics.pstdev(scored) if scored else float("nan"),
            "tool_calls": sum(r["tool_calls"] for r in rollouts) / len(rollouts),
            "tool_call_rate": sum(r["tool_calls"] > 0 for r in rollouts) / len(rollouts),
            "unscored": sum(r["reward"] is None for r in rollouts) / len(rollouts)}


def greedy_evals(run_dir: str | Path, new: dict[str, dict[str, float]] | None = None):
    """A run's eval rewards played greedily (``summary`` of each), a pandas DataFrame of a column a stage ("before
    SFT", "after SFT", "after GRPO"), kept in RUN_DIR/greedy-evals.csv; ``new`` stages are saved there first,
    replacing any of the same name, so a stage run again records its latest."""
    import pandas as pd

    path = Path(run_dir) / GREEDY_EVALS
    table = pd.read_csv(path, index_col=0) if path.is_file() else pd.DataFrame()
    if new:
        table = pd.concat([table.drop(columns=list(new), errors="ignore"), pd.DataFrame(new)], axis=1)
        table = table[sorted(table, key=lambda stage: STAGES.index(stage) if stage in STAGES else len(STAGES))]
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path)
    return table
