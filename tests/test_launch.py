"""The training command on N GPUs: each process sizes Unsloth's vLLM and caps its memory on its own GPU, as one card of
the preset's each; a launch that can't train is refused in one line; and what the Unsloth 2026.10.9 functions that put
each process's model and vLLM engine on that GPU answer (their source: tests/test_pinned_internals.py). No GPU
here: ``TwoGPUs`` is torch.cuda as a two-GPU machine reports it (the refusals are run as real launches in
tests/test_train_command.py)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets
from agentenv_nb.train.grpo import launch
from agentenv_nb.train.presets import PRESETS, vllm_sizing

H200, H100 = 139.8e9, 79.6e9


class TwoGPUs:
    """torch.cuda on a machine with an H200 (GPU 0) and an H100 (GPU 1), each with the memory fraction a process set
    on it. The current device stays 0, as on rank 1 before accelerate or Unsloth set it: what the kit must not size.
    ``available=False``: CUDA not said to be available, for what the kit asks through transformers."""

    def __init__(self, monkeypatch, available: bool = True):
        self.totals, self.fractions, self.capabilities = [H200, H100], [1.0, 1.0], [(9, 0), (9, 0)]
        gpu = lambda device=None: 0 if device is None else int(device)  # noqa: E731
        for name, fake in {"is_available": lambda: available, "device_count": lambda: 2, "current_device": lambda: 0,
                           "mem_get_info": lambda device=None: (self.totals[gpu(device)] / 2, self.totals[gpu(device)]),
                           "get_per_process_memory_fraction": lambda device=None: self.fractions[gpu(device)],
                           "set_per_process_memory_fraction": lambda fraction, device=None: self.fractions.__setitem__(
                               gpu(device), fraction),
                           "get_device_capability": lambda device=None: self.capabilities[gpu(device)]}.items():
            monkeypatch.setattr(torch.cuda, name, fake)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_holds_its_own_gpu_to_the_preset_card_and_sizes_vllm_there(monkeypatch, rank):
    gpus = TwoGPUs(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("AGENTENV_NB_GPU_MEMORY_GB", raising=False)
    card, four_bit = gpus.totals[rank], dataclasses.replace(presets.PRESETS["24gb"], vllm_weights="4bit")
    # the preset's card: vLLM gets half of 24 GB of this rank's GPU, uncapped or capped
    assert presets.model_kwargs(four_bit, "m", fast_inference=True)["gpu_memory_utilization"] == round(12e9 / card, 4)
    monkeypatch.setenv("AGENTENV_NB_GPU_MEMORY_GB", "24")
    vllm_sizing.hold_to_budget()  # as load_model does, before Unsloth loads
    assert gpus.fractions[rank] == pytest.approx(24e9 / card) and gpus.fractions[1 - rank] == 1.0  # not GPU 0's
    assert vllm_sizing.gpu_memory() == (card, 24e9)
    monkeypatch.delenv("AGENTENV_NB_GPU_MEMORY_GB")
    gpus.fractions[rank] = 16e9 / card  # a cap the user set on this rank's GPU is read there
    assert vllm_sizing.gpu_memory() == (card, pytest.approx(16e9))
    assert presets.model_kwargs(four_bit, "m", fast_inference=True)["gpu_memory_utilization"] == round(8e9 / card, 4)


def test_each_rank_chooses_vllms_weights_by_its_own_gpu(monkeypatch, tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128).save_pretrained(tmp_path)  # Qwen3-8B's
    gpus = TwoGPUs(monkeypatch, available=False)  # transformers counts the weights on the meta device
    gpus.capabilities = [(9, 0), (8, 9)]  # GPU 1 has no fp8 Unsloth quantizes to
    # 16.4 GB of 16-bit weights don't fit vLLM's share of a 24 GB card on either: fp8 where the GPU has it
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert presets.vllm_weights(PRESETS["24gb"], str(tmp_path)) == "4bit"
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert presets.vllm_weights(PRESETS["24gb"], str(tmp_path)) == "fp8"


def test_a_launch_that_cant_train_is_refused_in_one_line(monkeypatch):
    gpu, cpu = presets.named("24gb"), presets.named("cpu-tiny")
    assert launch.problem(gpu, processes=2, gpus=2, fsdp=False) is None
    assert launch.problem(gpu, processes=1, gpus=8, fsdp=False) is None
    assert launch.problem(cpu, processes=2, gpus=0, fsdp=True) is None  # CPU processes on gloo, as the tests run
    # FSDP where Unsloth's vLLM isn't asked for is Unsloth's own FSDP2 path, not refused here
    assert launch.problem(dataclasses.replace(gpu, vllm=False), processes=2, gpus=2, fsdp=True) is None
    refusals = {(gpu, 4, 2, False): ["4 processes were launched on this machine and it has 2 GPU(s) visible",
                                     "torchrun --nproc_per_node 2, accelerate launch --num_processes 2"],
                (gpu, 1, 0, False): ["the '24gb' preset trains on a GPU and none is visible here",
                                     "--preset cpu-tiny"],
                (gpu, 2, 2, True): ["FSDP can't train the '24gb' preset", "launch data parallel instead"]}
    for (preset, processes, gpus, fsdp), says in refusals.items():
        line = launch.problem(preset, processes=processes, gpus=gpus, fsdp=fsdp)
        assert all(part in line for part in says) and "\n" not in line, line
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not launch.fsdp_requested({}) and launch.fsdp_requested({"fsdp": "full_shard"})
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what accelerate launch --use_fsdp exports
    assert launch.fsdp_requested({})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert launch.processes_here() == 3


@pytest.mark.slow  # Unsloth's model code, in a fresh interpreter
def test_unsloth_puts_each_rank_and_its_vllm_engine_on_the_gpu_the_kit_sizes():
    """Unsloth places a launched process's model on GPU LOCAL_RANK, modulo the GPUs it sees, and unsloth_zoo starts
    its vLLM engine there, with vLLM's external_launcher executor in the launch's own process group, wherever
    torchrun's variables are set (accelerate launch sets them too); its FSDP reading of the launch is the kit's. In a
    fresh Python: importing ``unsloth.models`` puts Unsloth's trainers in TRL's place for the whole process, and the
    tests after this one train with TRL's own."""
    script = ("import pytest\nfrom tests.test_launch import unsloth_places_each_rank_on_the_gpu_the_kit_sizes as check\n"
              "with pytest.MonkeyPatch.context() as monkeypatch:\n    check(monkeypatch)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def unsloth_places_each_rank_on_the_gpu_the_kit_sizes(monkeypatch):
    import_unsloth()
    import unsloth.fsdp2_launch
    from unsloth.models import loader_utils
    from unsloth_zoo import vllm_utils

    TwoGPUs(monkeypatch)
    for seen in (2, 1):  # 1: a launcher that shows each process one GPU
        monkeypatch.setattr(torch.cuda, "device_count", lambda: seen)
        monkeypatch.setattr(loader_utils, "_visible_device_count", lambda: seen)
        for local_rank in range(4):
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
            assert loader_utils._infer_local_rank(local_rank) == vllm_sizing.this_gpu() == local_rank % seen
    # the external launcher: torchrun's and accelerate launch's variables (seen; the engine on that GPU: its source)
    accelerate_launch = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
    assert vllm_utils._torchrun_launch_info(accelerate_launch) == (1, 1, 2)
    assert vllm_utils._torchrun_launch_info({"LOCAL_RANK": "0"}) is None  # one process: vLLM's own executor
    # FSDP as the kit reads it (ACCELERATE_USE_FSDP) is FSDP to Unsloth, which refuses vLLM under its version 2
    for name in ("FSDP_VERSION", "UNSLOTH_FSDP2", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(name, raising=False)
    assert unsloth.fsdp2_launch.fsdp_version_from_env() == 0
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert unsloth.fsdp2_launch.fsdp_version_from_env() == 1 and launch.fsdp_requested({})
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(NotImplementedError, match="not supported with FSDP2"):
        loader_utils.raise_if_fast_inference_under_fsdp2(True)
