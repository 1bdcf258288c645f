"""Load a model for a preset through Unsloth (its GPU path, or its CPU path for the tiny model), and save a
warm start as both a LoRA adapter and a merged 16-bit model for the next notebook.

    model, tokenizer = load_model("unsloth/Qwen3-4B", "24gb")           # 4-bit, LoRA attached
    merged = save_warm_start(model, tokenizer, "runs/gridsim/sft")       # sft/adapter, sft/merged
    model, tokenizer = load_model("tiny", "cpu-tiny", corpus=texts)      # the offline tiny model
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets

TINY = "tiny"


def corpus(conversations: Iterable[dict]) -> list[str]:
    """Texts the tiny tokenizer learns its merges from: conversations (``messages`` and ``tools``, as rollouts
    and demonstrations hold them) written as JSON, numbers, tool calls and all."""
    return [json.dumps({"messages": c["messages"], "tools": c["tools"]}) for c in conversations]


@contextlib.contextmanager
def _without_progress_bars():
    """transformers' own loading and saving bars off: in a notebook they are widgets, which a saved notebook reopens
    as "Error displaying widget"; they take seconds. The Hub's download bars stay."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def load_model(name: str, preset: str, stage: str = "grpo", *, corpus: Iterable[str] = (),
               tiny_dir: str | Path = "models/tiny-qwen3"):
    """``name`` (a Hub id, a folder, or "tiny", built at ``tiny_dir`` from ``corpus``) loaded as ``preset``
    says for ``stage`` ("sft" or "grpo"): with LoRA on every linear layer, or every weight trainable where the
    preset fine-tunes in full, on the preset's torch threads; returns (model, tokenizer). The model's PAD/BOS/EOS
    ids are the tokenizer's, as every TRL trainer would set them (with a notice each time) otherwise."""
    import_unsloth()
    from transformers.trainer_utils import align_special_tokens
    from unsloth import FastLanguageModel

    with _without_progress_bars():
        if name == TINY:
            from agentenv_nb.train.tiny import build_tiny_model

            name = build_tiny_model(tiny_dir, corpus_texts=corpus)
        if threads := presets.torch_threads(preset):
            import torch

            torch.set_num_threads(threads)
        full = presets.full_finetuning(preset, stage)
        model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs(preset, name),
                                                             full_finetuning=full)
    if not full:
        model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs(preset))
    notices = logging.getLogger("transformers.trainer_utils")
    level = notices.level
    notices.setLevel(logging.ERROR)  # its notice says what it aligned: here that is expected
    try:
        align_special_tokens(model, tokenizer)
    finally:
        notices.setLevel(level)
    return model, tokenizer


def save_warm_start(model, tokenizer, folder: str | Path) -> str:
    """Save the LoRA adapter to ``folder/adapter`` and the merged 16-bit model to ``folder/merged``, which GRPO
    loads (in 4-bit again on a 24 GB GPU); a fully fine-tuned model has no adapter, only ``merged``. Returns the
    merged model's folder."""
    folder = Path(folder)
    if not hasattr(model, "peft_config"):
        with _without_progress_bars():
            model.save_pretrained(folder / "merged")
            tokenizer.save_pretrained(folder / "merged")
        return str(folder / "merged")
    with _without_progress_bars():
        model.save_pretrained(folder / "adapter")
        tokenizer.save_pretrained(folder / "adapter")
        model.save_pretrained_merged(str(folder / "merged"), tokenizer, save_method="merged_16bit")
    return str(folder / "merged")
