"""How much of the GPU Unsloth's colocated vLLM (``fast_inference=True``) may take.

vLLM's ``gpu_memory_utilization`` is a share of the WHOLE card, so a recipe's 0.5 means half of an H200 there, far
more than the 24 GB card the recipe was written for. Here the share is taken of the memory the run may use (the
card, a cap set with ``torch.cuda.set_per_process_memory_fraction``, or ``AGENTENV_NB_GPU_MEMORY_GB``), at most the
card a preset is made for, and turned back into a share of the card.

    utilization = gpu_memory_utilization(0.5, *gpu_memory(), made_for_bytes=24e9)
    hold_to_budget()   # with AGENTENV_NB_GPU_MEMORY_GB=24 on a larger card: the whole run as on a 24 GB one
"""

from __future__ import annotations

from agentenv_nb import settings


def gpu_memory() -> tuple[float, float | None]:
    """This GPU's memory in bytes, and what the run may use of it (None: all of it): ``AGENTENV_NB_GPU_MEMORY_GB``,
    else what ``torch.cuda.set_per_process_memory_fraction`` allows this process."""
    import torch

    card = torch.cuda.mem_get_info()[1]
    allowed = settings.get("gpu_memory_gb")
    if allowed is not None:
        if allowed * 1e9 > card:
            raise ValueError(f"AGENTENV_NB_GPU_MEMORY_GB={allowed:g} is more than this GPU's {card / 1e9:.1f} GB: "
                             "set it to at most that, or unset it to use the whole card")
        return card, allowed * 1e9
    fraction = torch.cuda.get_per_process_memory_fraction()
    return card, card * fraction if fraction < 1 else None


def hold_to_budget() -> None:
    """Cap this process's PyTorch allocations at ``AGENTENV_NB_GPU_MEMORY_GB`` where it is set and a GPU is seen,
    so a larger card runs as the card the setting names (vLLM is sized to it too, by ``gpu_memory``)."""
    allowed = settings.get("gpu_memory_gb")
    if allowed is None:
        return
    import torch

    if torch.cuda.is_available():
        card = gpu_memory()[0]
        torch.cuda.set_per_process_memory_fraction(allowed * 1e9 / card)


def gpu_memory_utilization(share: float, card_bytes: float, allowed_bytes: float | None = None,
                           made_for_bytes: float | None = None) -> float:
    """vLLM's ``gpu_memory_utilization`` giving it ``share`` of the memory a run may use: the least of the card,
    ``allowed_bytes`` and ``made_for_bytes`` (the card a preset is made for), as a share of ``card_bytes``."""
    budget = min(card_bytes, allowed_bytes or card_bytes, made_for_bytes or card_bytes)
    return round(share * budget / card_bytes, 4)
