"""Load a model for a preset through Unsloth (its GPU path, or its CPU path for the tiny model), and save a
warm start as both a LoRA adapter and a merged 16-bit model for the next notebook.

    model, tokenizer = load_model("unsloth/Qwen3-4B", "24gb")           # LoRA attached
    model, tokenizer = load_model("SmolLM2-135M-Instruct.Q4_1.gguf", "24gb")  # a GGUF file, made a model folder once
    merged = save_warm_start(model, tokenizer, "runs/gridsim/sft")       # sft/adapter, sft/merged
    model, tokenizer = load_model("tiny", "cpu-tiny", corpus=texts)      # the offline tiny model
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from agentenv_nb.library_log import to_log
from agentenv_nb.stack import import_unsloth
from agentenv_nb.stops import Stop
from agentenv_nb.train import presets
from agentenv_nb.train.presets import vllm_sizing
from agentenv_nb.train.model.tool_template import use_tool_template

TINY = "tiny"


def corpus(conversations: Iterable[dict]) -> list[str]:
    """Texts the tiny tokenizer learns its merges from: conversations (``messages`` and ``tools``, as rollouts
    and demonstrations hold them) written as JSON, numbers, tool calls and all."""
    return [json.dumps({"messages": c["messages"], "tools": c["tools"]}) for c in conversations]


def load_model(name: str, preset: presets.Preset | str, stage: str = "grpo", *, corpus: Iterable[str] = (),
               models_dir: str | Path = "models"):
    """``name`` (a Hub id, a folder, a GGUF file or a folder holding one, or "tiny", built from ``corpus``) loaded
    as ``preset`` says for ``stage`` ("sft" or "grpo"): with LoRA on every linear layer, or every weight trainable
    where the preset fine-tunes this model in full, on the preset's torch threads; a model larger than the preset
    trains here in reasonable time is refused in one line (``Stop``); returns (model, tokenizer). The tiny model
    and GGUF conversions are made once under ``models_dir``. The model's PAD/BOS/EOS ids are the tokenizer's, as
    every TRL trainer would set them (with a notice each time) otherwise. A chat template TRL parses no tool calls
    from is replaced by one it does (``tool_template.use_tool_template``), in one line."""
    import_unsloth()
    from transformers.trainer_utils import align_special_tokens
    from unsloth import FastLanguageModel

    preset = presets.named(preset)  # a run hands its own down; a name is looked up here, once

    vllm_sizing.hold_to_budget()
    gguf = None if name == TINY else gguf_file(name)
    if name == TINY or gguf:
        with to_log("making the model folder"):
            if gguf:
                name = from_gguf(gguf, Path(models_dir) / gguf.stem)
            else:
                from agentenv_nb.train.model.tiny import build_tiny_model

                name = build_tiny_model(Path(models_dir) / "tiny-qwen3", corpus_texts=corpus)
    if problem := presets.size_problem(preset, name):
        raise Stop(problem)
    with to_log("loading the model"):
        if threads := presets.torch_threads(preset):
            import torch

            torch.set_num_threads(threads)
        full = presets.full_finetuning(preset, stage, name)
        # vLLM where the preset generates on it, for SFT too (as Unsloth's GRPO notebooks fine-tune a fast_inference
        # model before GRPO): the warm start's evals and self-distillation's rollouts play there. Not for a model
        # trained in full, whose every weight vLLM would have to be handed after each step.
        engine = {"fast_inference": False} if full else {}
        model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs(preset, name, **engine),
                                                             full_finetuning=full)
        if not full:
            model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs(preset))
    use_tool_template(tokenizer)
    notices = logging.getLogger("transformers.trainer_utils")
    level = notices.level
    notices.setLevel(logging.ERROR)  # its notice says what it aligned: here that is expected
    try:
        align_special_tokens(model, tokenizer)
    finally:
        notices.setLevel(level)
    return model, tokenizer


def gguf_file(name: str | Path) -> Path | None:
    """The GGUF file ``name`` points at: the file itself, or the one ``.gguf`` in a folder with no config.json."""
    path = Path(name)
    if path.suffix == ".gguf" and path.is_file():
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ValueError(f"{path} holds several GGUF files ({', '.join(f.name for f in found)}): name one")
        return found[0] if found else None
    return None


def from_gguf(gguf: Path, folder: Path) -> str:
    """A model folder Unsloth loads, made once from ``gguf`` (transformers reads it, dequantized): bf16 weights and
    the file's tokenizer, with the EOS token its model ends turns with and a PAD token apart from it."""
    if (folder / "config.json").exists():
        return str(folder)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = _as_trained(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = gguf_model.config
    del config.quantization_config  # dequantized: an ordinary model, which save_pretrained takes
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict())
    # GGUF metadata may name another EOS than the config's (SmolLM2's says <|im_start|>); the config's is the one
    # its chat turns end with. No BOS where a chat template writes the first token itself; without one, the format
    # built for the model opens with its BOS (Gemma's text goes wrong without it)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    if getattr(tokenizer, "chat_template", None):
        tokenizer.bos_token = None
    tokenizer.clean_up_tokenization_spaces = False  # a WordPiece cleanup that BPE tokenizers warn about, and skip
    if tokenizer.pad_token in (None, tokenizer.eos_token) and tokenizer.unk_token not in (None, tokenizer.eos_token):
        tokenizer.pad_token = tokenizer.unk_token  # apart from EOS: an ended turn is not taken for padding
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id, model.config.bos_token_id = tokenizer.pad_token_id, tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    tokenizer.save_pretrained(folder)
    _check_reloads(tokenizer, folder)
    model.save_pretrained(folder)  # its config.json last: the folder is made
    print(f"agentenv_nb: {gguf.name} converted to a model folder at {folder}")
    return str(folder)


def _as_trained(tokenizer):
    """``tokenizer``, read from a GGUF file, tokenizing as its model was trained to. transformers reads a GGUF's
    SentencePiece vocabulary (Gemma's) as a Unigram over the pieces' scores, which splits words the model never saw
    split ("▁r", "un" for "▁run"); SentencePiece's BPE, as llama.cpp runs it, merges the highest-scoring pair first:
    a BPE whose merges are ordered by score (transformers' ``generate_merges``, as its SentencePiece converter does).
    Made a plain fast tokenizer, which saves and reloads that backend as it is: Gemma's tokenizer class rebuilds a
    BPE without merges from a saved Unigram, one token a character."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import generate_merges

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    if state["model"]["type"] != "Unigram":
        return tokenizer
    pieces = state["model"]["vocab"]
    vocab = {piece: index for index, (piece, _) in enumerate(pieces)}
    state["model"] = {"type": "BPE", "dropout": None, "unk_token": pieces[state["model"]["unk_id"]][0],
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                      "byte_fallback": state["model"].get("byte_fallback", False), "ignore_merges": False,
                      "vocab": vocab, "merges": [list(merge) for merge in generate_merges(vocab, pieces)]}
    special = {name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), add_bos_token=False,
                                   add_eos_token=False, **{k: v for k, v in special.items() if v is not None})


def _check_reloads(tokenizer, folder: Path) -> None:
    """Raise where the tokenizer saved in ``folder`` reads text otherwise than ``tokenizer``: the model would be
    trained on tokens it never saw."""
    from transformers import AutoTokenizer

    text = 'Call get_prices, then {"schedule": [1, -1, 0]}.\n<tool_call>'
    given, reloaded = tokenizer.encode(text), AutoTokenizer.from_pretrained(folder).encode(text)
    if given != reloaded:
        raise ValueError(f"transformers saves this GGUF file's tokenizer otherwise than it reads it ({len(reloaded)} "
                         f"tokens, not {len(given)}, for a line of text): bring the model as a folder or a Hub id")


def save_warm_start(model, tokenizer, folder: str | Path) -> str:
    """Save the LoRA adapter to ``folder/adapter`` and the merged 16-bit model to ``folder/merged``, which GRPO
    loads (in the precision its preset chooses there); a fully fine-tuned model has no adapter, only ``merged``.
    Returns the merged model's folder."""
    folder = Path(folder)
    if not hasattr(model, "peft_config"):
        with to_log("saving the model"):
            model.save_pretrained(folder / "merged")
            tokenizer.save_pretrained(folder / "merged")
        return str(folder / "merged")
    with to_log("saving the model"):
        model.save_pretrained(folder / "adapter")
        tokenizer.save_pretrained(folder / "adapter")
        model.save_pretrained_merged(str(folder / "merged"), tokenizer, save_method="merged_16bit")
    return str(folder / "merged")
