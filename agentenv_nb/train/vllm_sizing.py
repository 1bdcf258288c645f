"""How much of the GPU Unsloth's colocated vLLM (``fast_inference=True``) may take, and in what precision its
weights (which the LoRA training shares) fit the card: fp8, 16-bit or 4-bit.

vLLM's ``gpu_memory_utilization`` is a share of the WHOLE card, so a recipe's 0.5 means half of an H200 there, far
more than the 24 GB card the recipe was written for. Here the share is taken of the memory the run may use (the
card, a cap set with ``torch.cuda.set_per_process_memory_fraction``, or ``AGENTENV_NB_GPU_MEMORY_GB``), at most the
card a preset is made for, and turned back into a share of the card. The card is this process's (``this_gpu``):
on N GPUs each process sizes and caps its own, as one such card each.

    utilization = gpu_memory_utilization(0.5, *gpu_memory(), made_for_bytes=24e9)
    hold_to_budget()   # with AGENTENV_NB_GPU_MEMORY_GB=24 on a larger card: the whole run as on a 24 GB one
    choice, why = choose_weights((9, 0), vllm_bytes=12e9, weights_16bit_bytes=8.0e9)   # "fp8", and a line saying why

The precision (``Preset.vllm_weights``): the presets name 4-bit, the recipe's, measured end to end here; "auto" picks
by the card as Unsloth's docs rank them (https://docs.unsloth.ai/, "FP8 Reinforcement Learning"): fp8 where Unsloth
quantizes to it (``load_in_fp8=True``: vLLM's online per-channel fp8, the training model's frozen base the same fp8
weights, LoRA in 16-bit), 16-bit where those weights take at most half of vLLM's memory (the rest is the KV cache of a
step's rollouts), else 4-bit. On the H200 held to 24 GB, fp8 generated the Qwen3-4B shape's step 2.5x slower than
4-bit (docs/benchmarks.md), so "auto" is a choice a user names, not a preset's.
"""

from __future__ import annotations

import os

from agentenv_nb import settings

WEIGHTS = ("fp8", "16bit", "4bit")  # in the order "auto" tries them
# Unsloth 2026.10.9 quantizes to fp8 on the fly from compute capability 9.0 (Hopper, Blackwell): it refuses Ada
# (8.9: the L4, RTX 40), whose cards have fp8 too (loader_utils._get_fp8_mode_and_check_settings; tests/test_presets.py
# fails when that changes)
FP8_FROM = (9, 0)
KV_CACHE_SHARE = 0.5  # of vLLM's memory, kept for the KV cache when choosing 16-bit weights


def this_gpu() -> int:
    """This process's GPU: ``LOCAL_RANK`` under a launcher, modulo the GPUs it sees, as Unsloth places its model
    (``loader_utils._infer_local_rank``); without a launcher, the current device."""
    import torch

    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None:
        return torch.cuda.current_device()
    return int(local_rank) % max(torch.cuda.device_count(), 1)


def gpu_memory() -> tuple[float, float | None]:
    """This process's GPU's memory in bytes, and what the run may use of it (None: all of it):
    ``AGENTENV_NB_GPU_MEMORY_GB``, else what ``torch.cuda.set_per_process_memory_fraction`` allows this process."""
    import torch

    gpu = this_gpu()
    card = torch.cuda.mem_get_info(gpu)[1]
    allowed = settings.get("gpu_memory_gb")
    if allowed is not None:
        if allowed * 1e9 > card:
            raise ValueError(f"AGENTENV_NB_GPU_MEMORY_GB={allowed:g} is more than this GPU's {card / 1e9:.1f} GB: "
                             "set it to at most that, or unset it to use the whole card")
        return card, allowed * 1e9
    fraction = torch.cuda.get_per_process_memory_fraction(gpu)
    return card, card * fraction if fraction < 1 else None


def hold_to_budget() -> None:
    """Cap this process's PyTorch allocations on its GPU at ``AGENTENV_NB_GPU_MEMORY_GB`` where it is set and a GPU
    is seen, so a larger card runs as the card the setting names (vLLM is sized to it too, by ``gpu_memory``)."""
    allowed = settings.get("gpu_memory_gb")
    if allowed is None:
        return
    import torch

    if torch.cuda.is_available():
        card = gpu_memory()[0]
        torch.cuda.set_per_process_memory_fraction(allowed * 1e9 / card, this_gpu())


def gpu_memory_utilization(share: float, card_bytes: float, allowed_bytes: float | None = None,
                           made_for_bytes: float | None = None) -> float:
    """vLLM's ``gpu_memory_utilization`` giving it ``share`` of the memory a run may use: the least of the card,
    ``allowed_bytes`` and ``made_for_bytes`` (the card a preset is made for), as a share of ``card_bytes``."""
    budget = min(card_bytes, allowed_bytes or card_bytes, made_for_bytes or card_bytes)
    return round(share * budget / card_bytes, 4)


def choose_weights(capability: tuple[int, int], vllm_bytes: float, weights_16bit_bytes: float) -> tuple[str, str]:
    """The fastest precision of ``WEIGHTS`` for vLLM's weights on a card of compute ``capability`` where vLLM may take
    ``vllm_bytes`` and the model's weights are ``weights_16bit_bytes`` in 16-bit; and one line saying why."""
    card = f"compute capability {capability[0]}.{capability[1]}"
    if tuple(capability) >= FP8_FROM:
        return "fp8", f"fp8 weights: this card ({card}) has fp8, which Unsloth quantizes to as it loads"
    fits = weights_16bit_bytes <= (1 - KV_CACHE_SHARE) * vllm_bytes
    no_fp8 = (f"this card ({card}) has no fp8 Unsloth quantizes to on the fly (from {FP8_FROM[0]}.{FP8_FROM[1]})")
    room = (f"the 16-bit weights' {weights_16bit_bytes / 1e9:.1f} GB {'fit' if fits else 'exceed'} "
            f"{1 - KV_CACHE_SHARE:.0%} of vLLM's {vllm_bytes / 1e9:.1f} GB, the rest its KV cache")
    return ("16bit" if fits else "4bit"), f"{'16-bit' if fits else '4-bit'} weights: {no_fp8}; {room}"


def parameter_count(model_name: str) -> int:
    """The parameters of ``model_name`` (a folder or a Hub id), counted from its config on the meta device: nothing
    loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())


def weights_16bit_bytes(model_name: str) -> float:
    """The bytes of ``model_name``'s weights in 16-bit."""
    return 2.0 * parameter_count(model_name)
