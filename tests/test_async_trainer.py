"""The async trainer's settings and what it refuses before it starts: its config keeps the preset's GRPO settings
that TRL's AsyncGRPOConfig takes, and a model without vLLM gets one line saying what to load. Its training steps run
on a GPU only (tests/gpu/test_async_grpo.py)."""

import pytest

from agentenv_nb.train import configs, presets


def test_the_async_config_keeps_the_recipes_settings_it_takes(tmp_path):
    config = presets.async_grpo_config("24gb", output_dir=str(tmp_path), max_steps=7)
    assert type(config).__name__ == "AsyncGRPOConfig"
    sync = presets.grpo_kwargs("24gb", output_dir=str(tmp_path), max_steps=7)
    kept = {name: getattr(config, name) for name in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                      "num_generations", "max_completion_length", "temperature",
                                                      "learning_rate", "epsilon_high", "max_tool_calling_iterations",
                                                      "chat_template_kwargs", "max_steps", "seed", "warmup_steps")}
    assert kept == {name: sync[name] for name in kept}
    assert config.max_inflight_tasks == 32 and config.eval_strategy.value == "no"  # a step's rollouts, no eval loop
    assert configs.config_drift(config, presets.async_grpo_kwargs("24gb", output_dir=str(tmp_path), max_steps=7)) == {}


def test_a_model_without_vllm_is_refused_in_one_line(tmp_path):
    from agentenv_nb.train.grpo import async_grpo_trainer

    config = presets.async_grpo_config("cpu-tiny", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="generates on the model's own vLLM engine, and this model has none: load"):
        async_grpo_trainer(object(), None, config, env=None)
