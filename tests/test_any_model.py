"""Models of the four template families TRL parses no tool calls for train with tools through the kit: the tiny
model with a Llama 3, Gemma 3, Mistral or base-model tokenizer, loaded by ``load_model`` (which builds its
tool-calling template), passes the round trip, learns in TRL's SFTTrainer to write a call TRL's parser reads (in the
kit's ``play`` too), and trains a GRPO step whose rollouts call the environment's tool."""

import json
import random

import pytest

from .test_tiny_trl import Adder, _question, _sft_rows, grpo_step_calls_the_tool, one_thread  # noqa: F401

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", ["llama3", "gemma", "mistral", "base"])
def test_a_model_trl_does_not_know_learns_a_call_trl_parses_and_trains_a_grpo_step(family, tmp_path, capsys,
                                                                                    one_thread):
    import_unsloth()
    from datasets import Dataset
    from transformers.utils import get_json_schema
    from trl import SFTTrainer
    from trl.chat_template_utils import parse_response

    from agentenv_nb.client.checks import template_problems
    from agentenv_nb.train.model.loading import load_model, save_warm_start
    from agentenv_nb.train.rollout import play
    from agentenv_nb.train.model.tiny import build_tiny_model

    tool = get_json_schema(Adder().add)
    base = build_tiny_model(tmp_path / "tiny", corpus_texts=[json.dumps(tool)], family=family)
    model, tokenizer = load_model(base, "cpu-tiny", "sft")
    source = "a plain User:/Assistant: format" if family == "base" else "its own turns"
    assert f"tool calls with this model's chat template; using one built from {source}" in capsys.readouterr().out
    assert template_problems(tokenizer) == []  # the round trip env.check runs

    SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(_sft_rows(300, tool)),
               args=presets.sft_config("cpu-tiny", output_dir=str(tmp_path / "sft-run"), max_steps=120)).train()
    model.eval()
    prompt = tokenizer.apply_chat_template(_question(3, 4), tools=[tool], add_generation_prompt=True,
                                           return_dict=True, return_tensors="pt")
    ids = prompt["input_ids"][0].tolist()
    written = model.generate(**prompt, max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
    assert tokenizer.eos_token_id in written  # the turn ends at the model's own end-of-turn token
    [call] = parse_response(tokenizer, written, prefix=ids)["tool_calls"]
    assert call["function"]["name"] == "add" and set(call["function"]["arguments"]) == {"a", "b"}
    [played] = play(model, tokenizer, Adder, [{"prompt": _question(3, 4), "a": 3, "b": 4}], max_new_tokens=48)
    assert played["tool_calls"] >= 1 and played["messages"][2]["role"] == "tool"  # the kit's evals play it too

    merged = save_warm_start(model, tokenizer, tmp_path / "sft")
    capsys.readouterr()
    model, tokenizer = load_model(merged, "cpu-tiny", "grpo")  # LoRA; the template and its parser came along
    assert "using one built" not in capsys.readouterr().out
    rng = random.Random(1)
    grpo_step_calls_the_tool(model, tokenizer, [(rng.randrange(10), rng.randrange(10)) for _ in range(8)],
                             tmp_path / "grpo")
