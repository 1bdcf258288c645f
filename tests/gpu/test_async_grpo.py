"""Unsloth's AsyncGRPOTrainer on one CUDA GPU (``train.grpo.trainer.async_grpo_trainer``): the random Qwen3-4B-shaped
model loaded with vLLM in the weights "24gb" chooses for the card (16-bit for this shape), held to an L4's 24 GB, trains
two steps on GridSim through ``AgentEnv.local``, its rollout process playing ``env.factory`` pickled, built as
notebook 03 builds it with TRAINER="async" (``presets.trainer_config``, ``trainer_for``); then the greedy eval after
training plays on the same vLLM engine. The training command with ``--trainer async`` trains a step and writes that
greedy eval.
Skipped without a CUDA GPU or without vLLM, which the async trainer generates on.

    pytest tests/gpu/test_async_grpo.py -o addopts=    # AGENTENV_NB_GPU_MODEL: a model already built
"""

import json
import os
import subprocess
import sys

import pytest

from .test_gpu_path import _cuda, model_path  # noqa: F401  model_path: the random Qwen3-4B shape, a fixture

pytestmark = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: run `pytest tests/gpu` on a GPU machine")


@pytest.fixture(autouse=True)
def needs_vllm():
    from agentenv_nb.stack import import_unsloth, vllm_available

    import_unsloth()
    if not vllm_available()[0]:
        pytest.skip(f"the async trainer generates on vLLM: {vllm_available()[1]}")


# First: the command's process ends with its vLLM engine, which this process's would otherwise sit beside
def test_the_command_trains_async_and_scores_the_model_greedily_after(model_path, tmp_path):  # noqa: F811
    from agentenv_nb.tasks.gridsim import write_bundle

    bundle = write_bundle(tmp_path / "gridsim", train=8, eval=2)
    run_dir = tmp_path / "run"
    environ = {**os.environ, "AGENTENV_NB_GPU_MEMORY_GB": "24", "TRL_EXPERIMENTAL_SILENCE": "1"}
    done = subprocess.run([sys.executable, "-m", "agentenv_nb.train", "--trainer", "async", "--preset", "24gb",
                           "--bundle", str(bundle), "--run-dir", str(run_dir), "--warm-start", model_path,
                           "--sandbox", "process", "--server-processes", "2", "--max-steps", "1", "--eval-days", "2",
                           "--gguf", "", "--set", "gradient_accumulation_steps=1", "--set", "max_completion_length=256"],
                          capture_output=True, text=True, env=environ, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the async trainer has no eval loop" in done.stdout
    assert "greedy eval on 2 eval tasks: reward " in done.stdout
    logs = json.loads((run_dir / "grpo" / "trainer_state.json").read_text())["log_history"]
    assert [log["step"] for log in logs if "loss" in log] == [1] and not any("eval_reward" in log for log in logs)
    assert (run_dir / "greedy-evals.csv").is_file() and (run_dir / "trained" / "adapter").is_dir()


def test_async_grpo_trains_two_steps_on_the_models_own_vllm_then_plays_there(model_path, tmp_path):  # noqa: F811
    import torch

    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.grpo.trainer import trainer_for
    from agentenv_nb.train.rollout import generator, play, summary

    torch.cuda.set_per_process_memory_fraction(min(1.0, 24e9 / torch.cuda.mem_get_info()[1]))  # an L4's 24 GB
    bundle = write_bundle(tmp_path / "gridsim", train=8, eval=4)
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=16) as env:
        model, tokenizer = loading.load_model(model_path, "24gb")  # the weights the preset chooses for the card
        config = presets.trainer_config("async", "24gb", output_dir=str(tmp_path / "grpo"), max_steps=2,
                                        gradient_accumulation_steps=1, max_completion_length=256)
        trainer = trainer_for(model, tokenizer, config, env)
        assert type(trainer).__name__ == "AsyncGRPOTrainer"
        trainer.train()
        assert generator(trainer.model) == "vllm"
        played = play(trainer.model, tokenizer, env.factory, env.dataset_for("eval"), batch_size=4, max_new_tokens=64)
    assert trainer.state.global_step == 2
    rewards = [log for log in trainer.state.log_history if any(k.startswith(f"rewards/{env.name}") for k in log)]
    assert rewards, f"no step logged the env's reward: {trainer.state.log_history}"
    assert len(played) == 4 and summary(played)["unscored"] == 0, "the greedy eval after async training failed"
    assert torch.cuda.max_memory_reserved() <= 24e9
