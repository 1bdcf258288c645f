"""A Qwen3.5-format model trains here: the tiny one of that family (Qwen3.5's linear and full attention layers, TRL's
Qwen3.5 chat template) learns a tool call in TRL's SFTTrainer, TRL parses the call it writes (Qwen3.5's
``<function=...>`` markup, not Qwen3's JSON), and a GRPO step with an environment trains its LoRA weights."""

import random

import pytest

from .test_tiny_trl import Adder, _question, grpo_step_calls_the_tool  # the one-tool task, in Qwen3.5's format

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets

pytestmark = pytest.mark.slow


def test_a_qwen3_5_model_calls_tools_trl_parses_and_trains_a_grpo_step(tmp_path):
    import_unsloth()
    import torch
    from datasets import Dataset
    from transformers.utils import get_json_schema
    from trl import SFTTrainer
    from trl.chat_template_utils import add_response_schema, parse_response
    from unsloth import FastLanguageModel

    from agentenv_nb.train.model.tiny import build_tiny_model

    torch.set_num_threads(1)  # two spinning OpenMP threads on a shared 2-core machine are slower than one
    tool = get_json_schema(Adder().add)
    base = build_tiny_model(tmp_path / "tiny", family="qwen3.5")
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("cpu-tiny", base),
                                                         full_finetuning=True)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert {"linear_attention", "full_attention"} <= set(model.config.layer_types)

    rng, rows = random.Random(0), []
    for _ in range(300):
        a, b = rng.randrange(10), rng.randrange(10)
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        rows.append({"tools": [tool], "messages": [*_question(a, b), {"role": "assistant", "content": "",
                                                                        "tool_calls": [call]},
                                                   {"role": "tool", "name": "add", "content": str(a + b)},
                                                   {"role": "assistant", "content": f"The answer is {a + b}."}]})
    SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
               args=presets.sft_config("cpu-tiny", output_dir=str(tmp_path / "sft-run"), max_steps=120)).train()

    model.eval()
    add_response_schema(tokenizer)
    prompt = tokenizer.apply_chat_template(_question(3, 4), tools=[tool], add_generation_prompt=True,
                                           enable_thinking=False, return_dict=True, return_tensors="pt")
    ids = prompt["input_ids"][0].tolist()
    written = model.generate(**prompt, max_new_tokens=60, do_sample=False)[0, len(ids):].tolist()
    assert "<function=add>" in tokenizer.decode(written)  # Qwen3.5's markup
    [call] = parse_response(tokenizer, written, prefix=ids)["tool_calls"]
    assert call["function"]["name"] == "add" and set(call["function"]["arguments"]) == {"a", "b"}

    model.save_pretrained(tmp_path / "sft")
    tokenizer.save_pretrained(tmp_path / "sft")
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("cpu-tiny", str(tmp_path / "sft")))
    model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs("cpu-tiny"))
    grpo_step_calls_the_tool(model, tokenizer, [(1, 2), (4, 4), (9, 0)] * 4, tmp_path / "grpo")
