"""SFT data played through the env itself: a task adapter's expert demonstrations (GridSim's: the day's exact
optimum) and self-distillation's best rollouts, each a real conversation of tool calls and tool results.

    demos = expert_demonstrations(adapter_for(bundle).expert(), env.factory, env.dataset)   # scored by the verifier
    train_set = sft_dataset(d for d in demos if d["reward"] == 1.0)
    # self-distillation, as in agent-lightning's "Fine-tune with Unsloth SFT" recipe (microsoft/agent-lightning,
    # examples/unsloth): play the model, keep the top half by reward, fine-tune, repeat
    rollouts, kept = self_distill_round(model, tokenizer, env, "cpu-tiny", "runs/distill-0")
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable

from agentenv_nb.tasks.adapters import Expert
from agentenv_nb.train import presets
from agentenv_nb.train.rollout import Rollout, call_tools, environment_for, play, tool_methods
from agentenv_nb.train.warm_start import learnable


def expert_demonstrations(expert: Expert, factory: Callable, rows: Iterable[dict],
                          concurrency: int = 8) -> list[Rollout]:
    """Play each row with a task adapter's ``expert`` (``TaskAdapter.expert``) through real environments,
    ``concurrency`` episodes at once (at most the server's sessions): its tool calls, then end_turn with its reply.
    The verifier scores each as it scores the model; the rollouts come back in the rows' order."""
    from concurrent.futures import ThreadPoolExecutor

    rows = list(rows)
    lanes = max(1, min(concurrency, len(rows)))
    rollouts: list[Rollout | None] = [None] * len(rows)

    def play_lane(lane: int) -> None:  # one environment a lane, as TRL keeps one a rollout slot
        environment = environment_for(factory, lane)
        for index in range(lane, len(rows), lanes):
            rollouts[index] = _expert_episode(environment, rows[index], expert)

    with ThreadPoolExecutor(lanes, thread_name_prefix="agentenv_nb-expert") as pool:
        list(pool.map(play_lane, range(lanes)))  # list(): a lane's error is raised here
    return rollouts


def _expert_episode(environment, row: dict, expert: Expert) -> Rollout:
    from transformers.utils import get_json_schema

    environment.reset(**{k: v for k, v in row.items() if k != "environment"})
    rollout = Rollout(task_id=row.get("task_id", ""), messages=[dict(m) for m in row["prompt"]],
                      tools=[get_json_schema(tool) for tool in tool_methods(environment)], reward=None,
                      tool_calls=0, tool_failures=0)

    def act(name: str, arguments: dict) -> str:  # the assistant calls a tool; the environment's answer is recorded
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        rollout["messages"].append({"role": "assistant", "content": "", "tool_calls": [call]})
        call_tools(environment, [call], rollout)
        return rollout["messages"][-1]["content"]

    act("end_turn", {"response": expert(act, row)})
    rollout["reward"] = environment.get_reward()
    return rollout


def _arguments_as_text(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def top_fraction(rollouts: Iterable[Rollout], fraction: float, seed: int = 0, above: float = 0.0) -> list[Rollout]:
    """agent-lightning's selection: the scored rollouts shuffled, sorted by reward, the top ``fraction`` kept (at
    least one), shuffled again. Only rollouts scoring above ``above`` count: where most of a weak model's samples
    score 0, the top half would teach it its failures."""
    rng = random.Random(seed)
    scored = [r for r in rollouts if r["reward"] is not None and r["reward"] > above]
    rng.shuffle(scored)
    scored.sort(key=lambda r: r["reward"], reverse=True)
    kept = scored[:max(1, int(len(scored) * fraction))]
    rng.shuffle(kept)
    return kept


def sft_dataset(rollouts: Iterable[Rollout], tokenizer=None, preset: presets.Preset | str = "", model=None):
    """A conversational SFT set (``messages`` and ``tools`` columns, as TRL's SFTTrainer reads them). Tool-call
    arguments and the tools are kept as JSON text, which the chat template and TRL read as is: Arrow would
    otherwise merge them into one struct each and hand every call and schema the others' keys as nulls. With
    ``tokenizer`` (and ``preset``, ``model`` as ``presets.sft_config`` takes them), only the rows SFT can learn from
    there, what was lost said in one line, and ``Stop`` where too few are left (``learnable.sft_set``)."""
    from datasets import Dataset

    rows = [{"messages": [_arguments_as_text(m) for m in r["messages"]], "tools": json.dumps(r["tools"])}
            for r in rollouts]
    if not rows:
        raise ValueError("no rollouts to learn from: none was kept (check the rewards, or keep a larger fraction)")
    if tokenizer is not None:
        rows = learnable.sft_set(rows, tokenizer, preset, model)
    return Dataset.from_list(rows)


def best_rollouts(model, tokenizer, env, preset: presets.Preset | str, *, fraction: float = 0.5, samples: int = 2,
                  temperature: float | None = None, **play_kwargs) -> tuple[list[Rollout], list[Rollout]]:
    """Play each train task ``samples`` times (at the temperature ``preset``'s GRPO samples ``model`` at, unless
    given); the rollouts, and the top ``fraction`` of those that scored above 0 (``top_fraction``)."""
    if temperature is None:
        temperature = presets.grpo_temperature(preset, model)
    rows = [row for row in env.dataset for _ in range(samples)]
    rollouts = play(model, tokenizer, env.factory, rows, temperature=temperature, **play_kwargs)
    return rollouts, top_fraction(rollouts, fraction)


def self_distill_round(model, tokenizer, env, preset: presets.Preset | str, output_dir: str, *, fraction: float = 0.5,
                       samples: int = 2, temperature: float | None = None, max_steps: int | None = None,
                       callbacks: list | None = None, **play_kwargs) -> tuple[list[Rollout], list[Rollout]]:
    """One round of agent-lightning's Unsloth SFT loop: play each train task ``samples`` times (at ``preset``'s GRPO
    temperature unless given), fine-tune ``model`` in place on the top ``fraction`` of those that scored above 0 (TRL's
    SFTTrainer, ``preset``'s SFT settings, ``max_steps`` if given), or, where none did, say so and leave it; returns
    the round's rollouts and those kept."""
    from agentenv_nb.train.fit import fit

    rollouts, kept = best_rollouts(model, tokenizer, env, preset, fraction=fraction, samples=samples,
                                   temperature=temperature, **play_kwargs)
    if not kept:  # a weak model on verifiers without partial credit: nothing of its own to learn from this round
        print(f"none of the model's {len(rollouts)} rollouts scored above 0, so this round fine-tunes nothing")
        return rollouts, kept
    fit(sft_trainer(model, tokenizer, sft_dataset(kept, tokenizer, preset, model), preset, callbacks,
                    output_dir=output_dir, max_steps=max_steps))
    return rollouts, kept


def sft_trainer(model, tokenizer, dataset, preset: presets.Preset | str, callbacks=(), **config_kwargs):
    """TRL's SFTTrainer on ``dataset`` (``sft_dataset``'s) with ``preset``'s SFT settings for ``model`` and
    ``config_kwargs`` (``presets.sft_config``'s) over them, its micro-batch sized to the longest demonstration on a
    GPU (``choices.sft_micro_batch``)."""
    import torch
    from trl import SFTTrainer

    # rendered again only where it is used: a CPU's micro-batch is not sized to its logits
    longest = learnable.count(dataset.to_list(), tokenizer, None).longest if torch.cuda.is_available() else None
    return SFTTrainer(model=model, processing_class=tokenizer, train_dataset=dataset, callbacks=list(callbacks or ()),
                      args=presets.sft_config(preset, model=model, longest_tokens=longest, **config_kwargs))
