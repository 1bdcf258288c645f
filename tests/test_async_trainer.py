"""The async trainer's settings and what it refuses before it starts: its config keeps the preset's GRPO settings
that TRL's AsyncGRPOConfig takes, and a model without vLLM gets one line saying what to load. Its training steps run
on a GPU only (tests/gpu/test_async_grpo.py)."""

import pytest

from agentenv_nb.train import presets
from agentenv_nb.train.presets import PRESETS, configs


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
    assert config.token_budget == 0  # a step trains all 32 (micro-batches of 8), not what rows of max_model_len hold
    assert configs.config_drift(config, presets.async_grpo_kwargs("24gb", output_dir=str(tmp_path), max_steps=7)) == {}


def test_a_model_without_vllm_is_refused_in_one_line(tmp_path):
    from agentenv_nb.train.grpo.trainer import async_grpo_trainer

    config = presets.async_grpo_config("cpu-tiny", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="generates on the model's own vLLM engine, and this model has none: load"):
        async_grpo_trainer(object(), None, config, env=None)


def test_the_async_trainer_is_refused_where_it_cant_run_in_one_line():
    from agentenv_nb.notebook.preflight import check_trainer
    from agentenv_nb.train.grpo.launch import async_problem

    gpu, cpu = presets.named("24gb"), presets.named("cpu-tiny")
    runs = lambda: (True, "vllm imports and a CUDA GPU is visible")  # noqa: E731
    assert async_problem(gpu, processes=1, vllm=runs) is None
    assert "the 'cpu-tiny' preset generates without it: pick TRAINER='grpo', or a preset that generates on vLLM " \
           "('24gb', '16bit', '16gb')" in async_problem(cpu, processes=1, vllm=runs)
    assert "and 2 were launched: launch one" in async_problem(gpu, processes=2, vllm=runs)
    assert "which can't run here (vllm is not installed): pick TRAINER='grpo'" in async_problem(
        gpu, processes=1, vllm=lambda: (False, "vllm is not installed"))
    [row] = check_trainer("async", PRESETS["24gb"])  # notebook 03's preflight, on this machine without vLLM
    assert row["status"] == "fail" and row["fix"].startswith("pick TRAINER='grpo'")
    assert check_trainer("grpo", PRESETS["cpu-tiny"])[0]["status"] == "ok"
    assert check_trainer("sync", PRESETS["cpu-tiny"])[0]["fix"] == "TRAINER= one of grpo, async"


def test_each_trainer_gets_its_config_and_the_sessions_it_holds(tmp_path):
    from agentenv_nb.train.sessions import sessions_needed

    config = presets.trainer_config("async", "24gb", output_dir=str(tmp_path))
    assert type(config).__name__ == "AsyncGRPOConfig" and sessions_needed(config, beside=32) == 32 + 32
    assert sessions_needed(config, environments=2) == 64  # a pool of rollouts in flight a class, and no eval batch
    assert type(presets.trainer_config("grpo", "24gb", output_dir=str(tmp_path))).__name__ == "GRPOConfig"
    with pytest.raises(ValueError, match=r"unknown trainer 'sync'; choose one of \('grpo', 'async'\)"):
        presets.trainer_config("sync", "24gb", output_dir=str(tmp_path))


def test_an_async_run_without_eval_points_says_so_and_the_curve_takes_it(capsys):
    from agentenv_nb.notebook.curves import eval_curve, no_eval_loop

    trained = [{"loss": 0.1, "reward": 0.5, "step": 1}, {"loss": 0.2, "reward": 0.6, "step": 2}]
    assert no_eval_loop(trained) and eval_curve(trained).empty
    assert "logged training steps and no eval: the async trainer has no eval loop" in capsys.readouterr().out
    assert not no_eval_loop([*trained, {"eval_reward": 0.4, "step": 2}]) and not no_eval_loop([])
