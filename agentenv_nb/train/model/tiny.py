"""Random models built offline: a tiny one for CPU runs (Qwen3 layers; Qwen3 or another family's tokenizer and chat
template), a Qwen3-4B-shaped one for GPU benchmarks.

The tiny model lets the whole notebook sequence (SFT warm start, GRPO, eval) run on a CPU in minutes
without the Hugging Face Hub: a byte-level BPE tokenizer trained on a small corpus (tool-call markup
included, plus whatever texts the caller passes), TRL's chat template of its family (so TRL parses its tool
calls), and a randomly initialised model: ``Qwen3ForCausalLM``, or with ``family="qwen3.5"`` a
``Qwen3_5ForCausalLM`` (linear and full attention layers, TRL's Qwen3.5 template: ``<function=...>`` tool calls).
The families "llama3", "gemma", "mistral" and "base" keep the Qwen3 layers with a tokenizer of that family's special
tokens and its released chat template (none for "base"), from which TRL parses no tool calls: the kit's
``tool_template`` builds one.
The 4B-shaped model measures time and memory honestly where no weights can be downloaded; it can't measure reward.

Usage::

    from agentenv_nb.train.model.tiny import build_tiny_model, build_random_qwen3_4b

    path = build_tiny_model("models/tiny-qwen3", corpus_texts=[system_prompt, tools_json])
    path = build_tiny_model("models/tiny-qwen3.5", family="qwen3.5")   # Qwen3.5's layers and tool-call format
    path = build_tiny_model("models/tiny-gemma", family="gemma")       # Gemma 3's turns: <start_of_turn>...
    model, tokenizer = FastLanguageModel.from_pretrained(path, max_seq_length=2048)
    build_random_qwen3_4b("models/qwen3-4b-random", device="cuda")   # on the GPU machine
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from agentenv_nb.stack import hide_broken_torchvision

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Qwen3's special tokens: dropped by ``decode(skip_special_tokens=True)``."""
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
"""Qwen3's added, non-special tokens: kept when decoding, so TRL's parser sees the tool-call tags."""
QWEN3_VOCAB_SIZE = 151936
FAMILY_TOKENS = {
    "qwen3": (SPECIAL_TOKENS, None, "<|im_end|>", "<|endoftext|>"),
    "qwen3.5": (SPECIAL_TOKENS, None, "<|im_end|>", "<|endoftext|>"),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|finetune_right_pad_id|>"], "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"),
    "gemma": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<pad>"),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", "<unk>"),
    "base": (["<|endoftext|>", "<|padding|>"], None, "<|endoftext|>", "<|padding|>"),
}
"""Each family's special tokens, then its BOS, EOS and PAD: Llama 3's and Gemma's EOS is not the token that ends
their chat turns (``<|eot_id|>``, ``<end_of_turn>``), as in the released models' tokenizers."""
FAMILIES = tuple(FAMILY_TOKENS)
"""The tiny model's families: Qwen3 (JSON tool calls), Qwen3.5 (XML ``<function=...>`` tool calls), and four whose
templates TRL parses no tool calls from: Llama 3's header format, Gemma 3's turns, Mistral's ``[INST]`` format, and a
base model with no chat template."""
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
"""Mistral-7B-Instruct's chat template: no system or tool role, turns end with the EOS."""


def chat_template(family: str = "qwen3") -> str | None:
    """``family``'s chat template: for Qwen3 and Qwen3.5 TRL's, the exact string TRL recognises to parse its tool
    calls (thinking off for Qwen3.5, as TRL's ``qwen3_5_nothink`` template has it); for Llama 3 and Gemma TRL's copy of
    the released model's; none for the base model."""
    from trl import chat_template_utils

    if family not in FAMILIES:
        raise ValueError(f"no tiny model of family {family!r}; pick one of {', '.join(FAMILIES)}")
    return {"qwen3": chat_template_utils.qwen3_chat_template,
            "qwen3.5": chat_template_utils.qwen3_5_nothink_chat_template,
            "llama3": chat_template_utils.llama3_chat_template, "gemma": chat_template_utils.gemma3_chat_template,
            "mistral": MISTRAL_CHAT_TEMPLATE, "base": None}[family]

_SAMPLE_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "First number."},
            "b": {"type": "integer", "description": "Second number."}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "end_turn", "description": "End your turn and hand your answer to the task.",
        "parameters": {"type": "object", "properties": {
            "response": {"type": "string", "description": "Your final answer."}}, "required": []}}},
]


def default_corpus(family: str = "qwen3") -> list[str]:
    """Generic tool-calling chats rendered with ``family``'s template (Qwen3's where ``family``'s renders no tool
    calls), so BPE merges cover its markup and JSON."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = chat_template(family if family == "qwen3.5" else "qwen3")
    chats = []
    for i in range(200):
        a, b, city = i * 7 % 101, i * 13 % 97, ["Paris", "Austin", "Tokyo", "Lagos"][i % 4]
        name, args = [("add", {"a": a, "b": b}), ("get_weather", {"city": city, "unit": "celsius"}),
                      ("end_turn", {"response": f"The answer is {a + b}."})][i % 3]
        chats.append([
            {"role": "system", "content": "You are a helpful agent. Use the tools."},
            {"role": "user", "content": f"What is {a} plus {b}? And the weather in {city}?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": name, "arguments": args}}]},
            {"role": "tool", "name": name, "content": json.dumps({"result": a + b, "hour": i % 24})},
            {"role": "assistant", "content": f"It is {a + b}, and {i % 40} degrees."}])
    rendered, _ = render_jinja_template(chats[:20], tools=_SAMPLE_TOOLS, chat_template=template)
    plain, _ = render_jinja_template(chats[20:], chat_template=template)
    return [*rendered, *plain]


def build_tokenizer(corpus_texts: Iterable[str] = (), vocab_size: int = 2048, pad_to: int | None = None,
                    family: str = "qwen3"):
    """Train a byte-level BPE on the default corpus plus ``corpus_texts``; wrap it as a chat tokenizer of
    ``family``.

    ``pad_to`` fills the vocabulary with unreachable byte strings up to that size, so every id a
    larger random model can sample still decodes to text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special, bos, eos, pad = FAMILY_TOKENS[family]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator([*default_corpus(family), *corpus_texts], trainer=trainer)
    if pad_to is not None:
        bpe = _pad_vocab(bpe, pad_to - len(MARKUP_TOKENS))
    if family.startswith("qwen"):
        bpe.add_tokens(MARKUP_TOKENS)  # after the padding, so they take the last ids, as in Qwen3's vocabulary
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=pad, chat_template=chat_template(family),
        model_max_length=40960, padding_side="left")


def _pad_vocab(bpe, size: int):
    """Add byte-string entries (never produced by encoding) to the BPE vocab until it holds ``size`` ids."""
    from itertools import product

    from tokenizers import Tokenizer, pre_tokenizers

    state = json.loads(bpe.to_str())
    vocab = state["model"]["vocab"]
    taken, next_id = set(vocab), max(vocab.values()) + 1
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    for length in (2, 3):
        for chars in product(alphabet, repeat=length):
            if next_id >= size:
                return Tokenizer.from_str(json.dumps(state))
            piece = "".join(chars)
            if piece not in taken:
                vocab[piece] = next_id
                next_id += 1
    raise ValueError(f"can't pad a byte-level vocabulary to {size}")


def tiny_config(tokenizer, hidden_size: int = 64, num_hidden_layers: int = 2):
    """A Qwen3 config small enough to train in seconds on two CPU cores, sized to ``tokenizer``."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden_size // 4, max_position_embeddings=8192, max_window_layers=num_hidden_layers,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        **_token_ids(tokenizer))


def tiny_qwen3_5_config(tokenizer, hidden_size: int = 64, num_hidden_layers: int = 2):
    """A Qwen3.5 text config as small as ``tiny_config``'s, its layers alternating linear (gated delta) and full
    attention as Qwen3.5's do, sized to ``tokenizer``."""
    from transformers import Qwen3_5TextConfig

    heads = hidden_size // 16
    return Qwen3_5TextConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
        head_dim=16, linear_num_key_heads=heads // 2, linear_num_value_heads=heads, linear_key_head_dim=16,
        linear_value_head_dim=16, max_position_embeddings=8192, tie_word_embeddings=True,
        layer_types=[("linear_attention", "full_attention")[i % 2] for i in range(num_hidden_layers)],
        **_token_ids(tokenizer))


def qwen3_4b_config():
    """Qwen3-4B's published shape: 36 layers, hidden 2560, 32 heads (8 KV) of 128, vocab 151936."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        max_window_layers=36, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)


def _token_ids(tokenizer) -> dict:
    """The config's special-token ids, taken from the tokenizer (Qwen3 has no BOS it prepends: its config names
    <|endoftext|>)."""
    return {"bos_token_id": tokenizer.bos_token_id if tokenizer.bos_token else
            tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}


def build_tiny_model(path: str | os.PathLike, corpus_texts: Iterable[str] = (), seed: int = 0,
                     vocab_size: int = 2048, hidden_size: int = 64, num_hidden_layers: int = 2,
                     family: str = "qwen3") -> str:
    """Save a tokenizer and a random tiny model of ``family`` (``FAMILIES``) at ``path``; reuse the folder if it
    exists."""
    configure = tiny_qwen3_5_config if family == "qwen3.5" else tiny_config

    def make():
        tokenizer = build_tokenizer(corpus_texts, vocab_size=vocab_size, family=family)
        return configure(tokenizer, hidden_size, num_hidden_layers), tokenizer

    chat_template(family)  # an unknown family is refused before anything is built
    return _build(path, make, seed=seed, dtype="float32")


def build_random_qwen3_4b(path: str | os.PathLike, seed: int = 0, device: str | None = None,
                          corpus_texts: Iterable[str] = ()) -> str:
    """Save a random-initialised Qwen3-4B-shaped model in bf16 with the tiny tokenizer padded to its vocab.

    Build it on the GPU (``device="cuda"``): initialising 4B parameters on a CPU is slow.
    """
    def make():
        tokenizer = build_tokenizer(corpus_texts, pad_to=QWEN3_VOCAB_SIZE)
        config = qwen3_4b_config()
        config.update(_token_ids(tokenizer))
        return config, tokenizer

    return _build(path, make, seed=seed, dtype="bfloat16", device=device)


def _build(path, make, seed: int, dtype: str, device: str | None = None) -> str:
    """Build config, tokenizer and random weights into a temporary folder, then move it into place."""
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return str(path)
    hide_broken_torchvision()  # before transformers' model classes
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    staging.chmod(0o755)
    try:
        config, tokenizer = make()
        torch.manual_seed(seed)
        with torch.device(device or "cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.generation_config = GenerationConfig(
            eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id], pad_token_id=tokenizer.pad_token_id)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if path.exists():  # a half-built folder from an interrupted run
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(path)
