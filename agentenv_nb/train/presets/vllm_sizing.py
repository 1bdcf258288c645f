"""How much of the GPU Unsloth's colocated vLLM (``fast_inference=True``) may take, and in what precision its
weights (which the LoRA training shares) fit the card: 16-bit, fp8 or 4-bit.

vLLM's ``gpu_memory_utilization`` is a share of the WHOLE card, so a recipe's 0.5 means half of an H200 there, far
more than the 24 GB card the recipe was written for. Here the share is taken of the memory the run may use (the
card, a cap set with ``torch.cuda.set_per_process_memory_fraction``, or ``AGENTENV_NB_GPU_MEMORY_GB``), at most the
card a preset is made for, and turned back into a share of the card. The card is this process's (``this_gpu``):
on N GPUs each process sizes and caps its own, as one such card each.

    utilization = gpu_memory_utilization(0.5, *gpu_memory(), made_for_bytes=24e9)
    hold_to_budget()   # with AGENTENV_NB_GPU_MEMORY_GB=24 on a larger card: the whole run as on a 24 GB one
    choice, why = choose_weights((8, 9), vllm_16bit_bytes=16.6e9, weights_16bit_bytes=8.0e9, kv_cache_bytes=4.8e9)

The precision (``Preset.vllm_weights``; "auto", the card's choice) in the order of speed (docs/benchmarks.md):
16-bit where the weights and a step's KV cache fit the share vLLM takes with them, else fp8 where Unsloth quantizes
to it as it loads (``load_in_fp8=True``: vLLM's online per-channel fp8, the training model's frozen base the same
weights), else the recipe's 4-bit.
"""

from __future__ import annotations

import os

from agentenv_nb import settings

WEIGHTS = settings.SETTINGS["vllm_weights"].choices  # 16bit, fp8, 4bit: in the order "auto" tries them
# Unsloth 2026.10.9 quantizes to fp8 on the fly from compute capability 9.0 (Hopper, Blackwell): it refuses Ada
# (8.9: the L4, RTX 40), whose cards have fp8 too (loader_utils._get_fp8_mode_and_check_settings; a test fails
# when that changes)
FP8_FROM = (9, 0)


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


def free_for_training() -> float | None:
    """The bytes of GPU memory this process may still take (what ``gpu_memory`` allows, less what PyTorch holds,
    vLLM's share among it; no more than the card has free); None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    gpu = this_gpu()
    card, allowed = gpu_memory()
    return max(0.0, min((allowed or card) - torch.cuda.memory_reserved(gpu), torch.cuda.mem_get_info(gpu)[0]))


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


def choose_weights(capability: tuple[int, int], vllm_16bit_bytes: float, weights_16bit_bytes: float,
                   kv_cache_bytes: float) -> tuple[str, str]:
    """The fastest precision of ``WEIGHTS`` for vLLM's weights on a card of compute ``capability``, where vLLM may
    take ``vllm_16bit_bytes`` with 16-bit weights of ``weights_16bit_bytes`` and a step needs ``kv_cache_bytes`` of
    KV cache; and one line saying why."""
    fits = weights_16bit_bytes + kv_cache_bytes <= vllm_16bit_bytes
    room = (f"the 16-bit weights ({weights_16bit_bytes / 1e9:.1f} GB) and a step's KV cache "
            f"({kv_cache_bytes / 1e9:.1f} GB) {'fit' if fits else 'exceed'} the {vllm_16bit_bytes / 1e9:.1f} GB vLLM "
            "may take")
    if fits:
        return "16bit", f"16-bit weights: {room}"
    card = f"compute capability {capability[0]}.{capability[1]}"
    if tuple(capability) >= FP8_FROM:
        return "fp8", f"fp8 weights: {room}, and this card ({card}) has fp8, which Unsloth quantizes to as it loads"
    return "4bit", (f"4-bit weights: {room}, and this card ({card}) has no fp8 Unsloth quantizes to on the fly "
                    f"(from {FP8_FROM[0]}.{FP8_FROM[1]})")


def parameter_count(model) -> int:
    """The parameters of ``model`` (a folder, a Hub id, or a loaded model), counted from its config on the meta
    device: nothing loaded, and the same count for a model loaded with LoRA or in 4-bit as for its folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = model.config if hasattr(model, "config") else AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        counted = AutoModelForCausalLM.from_config(config)
    return sum(parameter.numel() for parameter in counted.parameters())


def weights_16bit_bytes(model_name: str) -> float:
    """The bytes of ``model_name``'s weights in 16-bit."""
    return 2.0 * parameter_count(model_name)


def kv_cache_bytes(model_name: str, tokens: int) -> float:
    """The bytes of 16-bit KV cache ``tokens`` tokens of ``model_name`` take in vLLM, from its config alone."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_name).get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2.0 * 2 * config.num_hidden_layers * kv_heads * head_dim * tokens  # a key and a value, 2 bytes each
