"""What a launch of the training command can run, said before anything slow starts; and which GPU is this process's.

``torchrun --nproc_per_node N`` and ``accelerate launch --num_processes N`` start N processes on a machine and give
each its ``LOCAL_RANK``. Unsloth loads each process's model, and with ``fast_inference`` its own vLLM engine
(unsloth_zoo's ``external_launcher`` executor), on GPU ``LOCAL_RANK``. ``vllm_sizing`` reads and caps the memory of
that same GPU (``vllm_sizing.this_gpu``), not of the current device: accelerate's PartialState sets the device as the
GRPOConfig is built, Unsloth as the model loads, and a process that sizes vLLM before either would otherwise size GPU 0.

    problem(presets.PRESETS["24gb"], processes=2, gpus=1, fsdp=False)   # one line: a GPU for each process
    async_problem(presets.PRESETS["cpu-tiny"], processes=1)             # the async trainer generates on vLLM
    launch_problem(preset, {"fsdp": "full_shard"}, trainer="grpo")     # this process's launch: FSDP with vLLM
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentenv_nb.train.naming import NOTEBOOK, Naming

if TYPE_CHECKING:
    from agentenv_nb.train.presets import Preset


def processes_here() -> int:
    """The processes the launcher started on this machine (``LOCAL_WORLD_SIZE``, which torchrun and accelerate launch
    set); 1 without one."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def processes_launched() -> int:
    """The processes of the whole launch, on every machine (``WORLD_SIZE``, which torchrun and accelerate launch
    set); 1 without a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def fsdp_requested(settings: dict) -> bool:
    """Whether the launch trains with FSDP: ``accelerate launch --use_fsdp`` or an FSDP config
    (``ACCELERATE_USE_FSDP``, which accelerate builds FSDP from), or an ``fsdp`` GRPOConfig setting."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_FSDP") or bool(settings.get("fsdp"))


def problem(preset: Preset, processes: int, gpus: int, fsdp: bool) -> str | None:
    """Why ``processes`` processes of ``preset`` on a machine with ``gpus`` visible GPUs can't train (``fsdp``: sharded
    rather than data parallel), in one line saying what to launch instead; None if they can."""
    if preset.on_cpu:
        return None
    if fsdp and preset.vllm:  # Unsloth refuses FSDP2 too, but only as the model loads, with a traceback
        return (f"FSDP can't train the '{preset.name}' preset: its rollouts come from Unsloth's vLLM, which shares the "
                "whole model's weights in each process (Unsloth refuses it under FSDP2); launch data parallel "
                "instead, a whole copy on each GPU: torchrun, or accelerate launch without --use_fsdp or an FSDP "
                "config")
    if gpus == 0:
        return (f"the '{preset.name}' preset trains on a GPU and none is visible here: run on a machine with an NVIDIA "
                "GPU, or pass --preset cpu-tiny to train the tiny model on the CPU")
    if gpus < processes:
        return (f"{processes} processes were launched on this machine and it has {gpus} GPU(s) visible: each trains on "
                f"a GPU of its own (its model copy and its vLLM engine), so launch at most {gpus} (torchrun "
                f"--nproc_per_node {gpus}, accelerate launch --num_processes {gpus}), or make more GPUs visible "
                "(CUDA_VISIBLE_DEVICES)")
    return None


# What an async run shows in place of eval points, said once where it is picked (preflight, the command)
ASYNC_EVALS = ("the async trainer has no eval loop (TRL's AsyncGRPOTrainer): no eval points by step; the greedy eval "
               "after training is the run's figure")


def async_problem(preset: Preset, processes: int, vllm: Callable[[], tuple[bool, str]] | None = None,
                  naming: Naming = NOTEBOOK) -> str | None:
    """Why the async trainer (``train.grpo.trainer.async_grpo_trainer``) can't train ``preset`` in a launch of
    ``processes`` processes, in one line saying what to pick instead, in ``naming``'s words; None if it can. Whether
    vLLM runs here is asked last, of ``vllm`` (default ``stack.vllm_available``, which imports it)."""
    from agentenv_nb.stack import vllm_available
    from agentenv_nb.train.presets import PRESETS

    grpo = naming.given("trainer", "'grpo'")
    if preset.on_cpu or not preset.vllm:
        fast = ", ".join(repr(name) for name, p in PRESETS.items() if p.vllm and not p.on_cpu)
        return (f"the async trainer generates on the model's own vLLM, and the '{preset.name}' preset generates "
                f"without it: pick {grpo}, or a preset that generates on vLLM ({fast}) on a GPU")
    if processes > 1:
        return (f"the async trainer trains in one process on one GPU (Unsloth serves that process's vLLM to TRL's "
                f"rollout worker), and {processes} were launched: launch one, or pick {grpo}, which trains data "
                "parallel")
    ok, why = (vllm or vllm_available)()
    if not ok:
        return (f"the async trainer generates on the model's own vLLM, which can't run here ({why}): pick {grpo}, "
                "which generates with transformers' generate where there is no vLLM")
    return None


def launch_problem(preset: Preset, settings: dict, trainer: str = "grpo", naming: Naming = NOTEBOOK) -> str | None:
    """``problem`` for this process's launch: its launcher's environment, the GPUs it sees, and ``settings`` (the
    GRPOConfig's, over the preset's); then, for the "async" ``trainer``, ``async_problem`` (which imports vLLM)."""
    import torch

    found = problem(preset, processes_here(), torch.cuda.device_count(), fsdp_requested(settings))
    if found or trainer != "async":
        return found
    return async_problem(preset, processes_launched(), naming=naming)
