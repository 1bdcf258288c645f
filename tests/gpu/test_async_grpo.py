"""Unsloth's AsyncGRPOTrainer on one CUDA GPU (``train.grpo.async_grpo_trainer``): the random Qwen3-4B-shaped model
loaded with vLLM (4-bit, the path tests/gpu/test_gpu_path.py checks), held to an L4's 24 GB, trains two steps on
GridSim through ``AgentEnv.local``, its rollout process playing ``env.factory`` pickled. Skipped without a CUDA GPU
or without vLLM, which the async trainer generates on.

    pytest tests/gpu/test_async_grpo.py -o addopts=    # AGENTENV_NB_GPU_MODEL: a model already built
"""

import dataclasses
import os

import pytest

from .test_gpu_path import _cuda

pytestmark = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: run `pytest tests/gpu` on a GPU machine")


def test_async_grpo_trains_two_steps_on_the_models_own_vllm(tmp_path):
    import torch

    from agentenv_nb.stack import import_unsloth, vllm_available

    import_unsloth()
    if not vllm_available()[0]:
        pytest.skip(f"the async trainer generates on vLLM: {vllm_available()[1]}")
    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.train import models, presets
    from agentenv_nb.train.grpo import async_grpo_trainer
    from agentenv_nb.train.tiny import build_random_qwen3_4b

    torch.cuda.set_per_process_memory_fraction(min(1.0, 24e9 / torch.cuda.mem_get_info()[1]))  # an L4's 24 GB
    model_path = os.environ.get("AGENTENV_NB_GPU_MODEL") or build_random_qwen3_4b(tmp_path / "q4b", device="cuda")
    four_bit = dataclasses.replace(presets.PRESETS["24gb"], vllm_weights="4bit")
    bundle = write_bundle(tmp_path / "gridsim", train=8, eval=1)
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=16) as env:
        model, tokenizer = models.load_model(model_path, four_bit)
        config = presets.async_grpo_config(four_bit, output_dir=str(tmp_path / "grpo"), max_steps=2,
                                           gradient_accumulation_steps=1, max_completion_length=256)
        trainer = async_grpo_trainer(model, tokenizer, config, env)
        trainer.train()
    assert trainer.state.global_step == 2
    rewards = [log for log in trainer.state.log_history if any(k.startswith(f"rewards/{env.name}") for k in log)]
    assert rewards, f"no step logged the env's reward: {trainer.state.log_history}"
    assert torch.cuda.max_memory_reserved() <= 24e9
