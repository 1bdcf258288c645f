"""The tiny offline model trains end to end on a CPU: SFT until it emits a tool call TRL parses, then GRPO.

Real TRL trainers, real steps: SFT with assistant-only loss on Qwen3-format tool-calling chats, then
two GRPO steps with the ``cpu-tiny`` preset, LoRA, and an in-process ``environment_factory``.
"""

import copy
import json
import random

import pytest

from agentenv_nb.train import presets
from agentenv_nb.train.presets import configs
from agentenv_nb.stack import import_unsloth

pytestmark = pytest.mark.slow


class Adder:
    """A toy environment: its one tool adds two integers; the reward is how close its sum is to the task's."""

    created = 0

    def __init__(self):
        Adder.created += 1
        self.target = self.answer = None

    def reset(self, **row):
        self.target, self.answer = row["a"] + row["b"], None

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.answer = a + b
        return str(a + b)

    def get_reward(self) -> float:
        return 0.0 if self.answer is None else 1.0 - min(abs(self.answer - self.target), 18) / 18


def _question(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a} plus {b}?"}]


def _sft_rows(n: int, tool: dict) -> list[dict]:
    """Chats where the assistant calls ``add`` with the question's numbers, reads the result, and answers."""
    rng, rows = random.Random(0), []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        rows.append({"tools": [tool], "messages": [
            *_question(a, b), {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": f"The answer is {a + b}."}]})
    return rows


def _task_rows(pairs) -> list[dict]:
    return [{"prompt": _question(a, b), "a": a, "b": b} for a, b in pairs]


def _first_tool_call(model, tokenizer, tool: dict) -> dict:
    """Greedy-decode one answer and parse it with TRL's own response parser, as GRPO does."""
    from trl.chat_template_utils import add_response_schema, parse_response

    add_response_schema(tokenizer)
    prompt = tokenizer.apply_chat_template(_question(3, 4), tools=[tool], add_generation_prompt=True,
                                           enable_thinking=False, return_dict=True, return_tensors="pt").to(model.device)
    out = model.generate(**prompt, max_new_tokens=48, do_sample=False)
    prompt_ids = prompt["input_ids"][0].tolist()
    return parse_response(tokenizer, out[0, len(prompt_ids):].tolist(), prefix=prompt_ids)


def grpo_step_calls_the_tool(model, tokenizer, pairs, out) -> None:
    """One GRPO step of the cpu-tiny preset on the Adder task over ``pairs``: it calls the tool and moves the LoRA."""
    from datasets import Dataset
    from trl import GRPOTrainer

    trainer = GRPOTrainer(model=model, processing_class=tokenizer, environment_factory=Adder,
                          train_dataset=Dataset.from_list(_task_rows(pairs)),
                          args=presets.grpo_config("cpu-tiny", output_dir=str(out), max_steps=1, eval_strategy="no",
                                                    eval_on_start=False))
    lora = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    trainer.train()
    [step] = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert step["tools/call_frequency"] > 0  # sampled at the preset's temperature, some calls may miss
    if step["frac_reward_zero_std"] < 1:  # where every group scored alike (each sum right), GRPO has no gradient
        assert any(not p.equal(lora[name]) for name, p in model.named_parameters() if "lora_" in name)


@pytest.fixture
def one_thread():
    """One torch thread: on a 2-core machine shared with other work, two spinning OpenMP threads made SFT
    take 150-400 s instead of 11 s; one thread takes 21 s under the same load."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_sft_then_grpo_on_cpu(tmp_path, one_thread):
    import_unsloth()
    from datasets import Dataset
    from transformers.utils import get_json_schema
    from trl import GRPOTrainer, SFTTrainer
    from unsloth import FastLanguageModel

    from agentenv_nb.train.model.tiny import build_tiny_model

    tool = get_json_schema(Adder().add)  # the schema TRL renders for the environment's method
    base = build_tiny_model(tmp_path / "tiny", corpus_texts=[json.dumps(tool)])
    assert build_tiny_model(tmp_path / "tiny") == base  # reused, not rebuilt

    # (b) SFT warm start, full fine-tuning: assistant-only loss until it writes a parseable tool call.
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("cpu-tiny", base),
                                                         full_finetuning=True)
    sft = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(_sft_rows(400, tool)),
                     args=presets.sft_config("cpu-tiny", output_dir=str(tmp_path / "sft-run")))
    labels = sft.train_dataset[0]["labels"]
    assert 0 < sum(label != -100 for label in labels) < len(labels) / 2  # only the assistant's turns
    sft.train()
    model.eval()
    calls = _first_tool_call(model, tokenizer, tool).get("tool_calls", [])
    assert calls and calls[0]["function"]["name"] == "add"
    assert set(calls[0]["function"]["arguments"]) == {"a", "b"}
    sft.save_model(str(tmp_path / "sft"))
    tokenizer.save_pretrained(str(tmp_path / "sft"))

    # (c) Two GRPO steps from the SFT model with LoRA, the cpu-tiny preset, and the toy environment.
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("cpu-tiny", str(tmp_path / "sft")))
    model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs("cpu-tiny"))
    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path / "grpo"), max_steps=2)
    before = copy.deepcopy(config)
    rng, Adder.created = random.Random(1), 0
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=config, environment_factory=Adder,
        train_dataset=Dataset.from_list(_task_rows((rng.randrange(10), rng.randrange(10)) for _ in range(16))),
        eval_dataset=Dataset.from_list(_task_rows([(1, 2), (4, 4), (9, 0), (6, 3)])))
    configs.check_config(trainer.args, before)  # the trainer kept every setting too
    lora = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    trainer.train()

    logs = trainer.state.log_history
    train_logs = [log for log in logs if "tools/call_frequency" in log]
    assert len(train_logs) == 2 and max(log["tools/call_frequency"] for log in train_logs) > 0
    assert sum("eval_reward" in log for log in logs) == 2  # at the start and at the end
    changed = [name for name, p in model.named_parameters() if "lora_" in name and not p.equal(lora[name])]
    assert changed, "no LoRA weight changed in two GRPO steps"
    from agentenv_nb.train.sessions import sessions_needed

    assert Adder.created == sessions_needed(config)  # TRL's pool: one env a rollout in flight
