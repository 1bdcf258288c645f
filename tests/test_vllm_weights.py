"""The precision of vLLM's weights (which LoRA trains on) by the card: 16-bit where the weights and a step's KV cache
fit, else fp8 where Unsloth quantizes to it, else 4-bit; a user names another. And what the Unsloth functions the
fp8 choice builds on answer (Unsloth 2026.10.9, vLLM 0.29.0; their source: tests/test_pinned_internals.py)."""

import dataclasses

import pytest

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets
from agentenv_nb.train.presets import PRESETS, vllm_sizing

QWEN3_4B_16BIT, QWEN3_8B_16BIT = 8.04e9, 16.4e9  # 4.02 B and 8.19 B parameters in 16-bit
QWEN3_KV_STEP = 32 * 1024 * 147456  # 32 rollouts of 1,024 tokens; 36 layers x 8 KV heads x 128 x 2 x 2 bytes a token
VLLM_16BIT_24GB = 0.69 * 24e9  # the "24gb" preset's vLLM with 16-bit weights


def qwen3_4b_config(folder):
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True
                ).save_pretrained(folder)  # Qwen3-4B's published shape, no weights
    return str(folder)


@pytest.mark.parametrize(("capability", "vllm_bytes", "weights", "choice", "words"), [
    ((8, 9), VLLM_16BIT_24GB, QWEN3_4B_16BIT, "16bit", "(8.0 GB) and a step's KV cache (4.8 GB) fit the 16.6 GB"),  # L4
    ((9, 0), VLLM_16BIT_24GB, QWEN3_4B_16BIT, "16bit", "fit"),  # H100, H200: faster than their fp8
    ((9, 0), VLLM_16BIT_24GB, QWEN3_8B_16BIT, "fp8", "exceed the 16.6 GB vLLM may take, and this card (compute "
                                                     "capability 9.0) has fp8"),
    ((12, 0), VLLM_16BIT_24GB, QWEN3_8B_16BIT, "fp8", "has fp8"),  # RTX 50
    ((8, 9), VLLM_16BIT_24GB, QWEN3_8B_16BIT, "4bit", "no fp8 Unsloth quantizes to on the fly (from 9.0)"),
    ((7, 5), 0.69 * 15e9, QWEN3_4B_16BIT, "4bit", "exceed the 10.3 GB"),  # T4 (Colab's free card)
])
def test_the_card_chooses_the_fastest_precision_and_says_why_in_one_line(capability, vllm_bytes, weights, choice,
                                                                         words):
    chosen, why = vllm_sizing.choose_weights(capability, vllm_bytes, weights, QWEN3_KV_STEP)
    assert chosen == choice and words in why and "\n" not in why
    assert why.startswith({"fp8": "fp8 weights", "16bit": "16-bit weights", "4bit": "4-bit weights"}[choice])


def test_the_gpu_a_run_needs_follows_the_weights_named_for_vllm(monkeypatch):
    """Preflight's need: 16-bit weights' whole process unless 4-bit or fp8 ones are named, and less again without
    vLLM (the figures: docs/benchmarks.md)."""
    assert presets.gpu_need_gb(PRESETS["24gb"], vllm=True) == 21.0  # "auto", no model named: the card may choose 16-bit
    assert presets.gpu_need_gb(PRESETS["24gb"], weights="4bit", vllm=True) == 17.0
    assert presets.gpu_need_gb(PRESETS["24gb"], weights="fp8", vllm=True) == 17.0
    assert presets.gpu_need_gb(PRESETS["24gb"], weights="16bit", vllm=True) == 21.0
    assert presets.gpu_need_gb(PRESETS["16bit"], vllm=True) == 40.0
    assert presets.gpu_need_gb(PRESETS["24gb"], weights="4bit", vllm=False) == 13.0
    monkeypatch.setenv("AGENTENV_NB_VLLM_WEIGHTS", "fp8")
    assert presets.vllm_weights(PRESETS["24gb"]) == "fp8" and presets.gpu_need_gb(PRESETS["24gb"], vllm=True) == 17.0
    assert presets.vllm_weights(PRESETS["16bit"]) == "16bit"  # a preset that names its weights keeps them


def _a_card(monkeypatch, total: float, capability: tuple[int, int], free: float | None = None) -> None:
    """torch.cuda as a card of ``total`` bytes and compute ``capability`` would show it (no GPU here); nothing held.
    Qwen3's model code is imported first: importing it under the fake card, torchao asks triton for the card's
    properties, which no fake gives, so a test run alone would fail there."""
    import torch
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    for name, fake in {"is_available": lambda: True, "current_device": lambda: 0,
                       "mem_get_info": lambda *_: (total if free is None else free, total),
                       "get_per_process_memory_fraction": lambda *_: 1.0, "get_device_name": lambda *_: "a card",
                       "memory_reserved": lambda *_: 0, "get_device_capability": lambda *_: capability}.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.delenv("AGENTENV_NB_GPU_MEMORY_GB", raising=False)
    monkeypatch.delenv("AGENTENV_NB_VLLM_WEIGHTS", raising=False)


def test_preflight_counts_the_memory_of_the_weights_the_model_loads_in(monkeypatch, tmp_path):
    """On a T4 the "16gb" preset loads Qwen3-4B for vLLM in 4-bit (16-bit weights and a step's KV cache exceed its
    share): preflight asks for the free memory that run needs, not a 16-bit one's, so 13 GiB free passes."""
    from agentenv_nb.notebook.preflight import check_gpu
    from agentenv_nb.train.presets import choices

    _a_card(monkeypatch, 15.8e9, (7, 5), free=13 * 2**30)
    monkeypatch.setattr(choices, "fast_inference", lambda preset: True)  # vLLM, as on a GPU host
    model = qwen3_4b_config(tmp_path)
    assert presets.model_kwargs("16gb", model)["load_in_4bit"]  # the load: 4-bit weights
    [row] = check_gpu(PRESETS["16gb"], model)
    assert row["status"] == "ok" and row["detail"].endswith("the 16gb preset needs 12")
    [row] = check_gpu(PRESETS["16gb"], str(tmp_path / "not-saved-yet"))  # notebook 02 not run: the most it may need
    assert row["status"] == "fail" and row["detail"].endswith("the 16gb preset needs 14")


def test_the_16bit_weights_and_a_steps_kv_cache_are_counted_from_the_config_alone(tmp_path):
    model = qwen3_4b_config(tmp_path)
    assert vllm_sizing.weights_16bit_bytes(model) == pytest.approx(QWEN3_4B_16BIT, rel=0.01)
    assert vllm_sizing.kv_cache_bytes(model, 32 * 1024) == QWEN3_KV_STEP


@pytest.mark.parametrize(("weights", "loaded_in"), [
    ("fp8", {"load_in_4bit": False, "load_in_fp8": True}), ("16bit", {"load_in_4bit": False}),
    ("4bit", {"load_in_4bit": True})])
def test_a_named_precision_is_what_unsloth_loads_with_vllm(weights, loaded_in):
    mine = dataclasses.replace(presets.PRESETS["24gb"], vllm_weights=weights)
    kwargs = presets.model_kwargs(mine, "m", fast_inference=True, gpu_memory_utilization=0.25)
    assert {k: kwargs.get(k) for k in ("load_in_4bit", "load_in_fp8")} == {"load_in_fp8": None, **loaded_in}
    assert kwargs["fast_inference"] and kwargs["gpu_memory_utilization"] == 0.25
    # without vLLM (the SFT stage, transformers' generate) the preset's own load_in_4bit: 4-bit QLoRA
    assert presets.model_kwargs(mine, "m", fast_inference=False) == {
        "model_name": "m", "max_seq_length": 4096, "load_in_4bit": True, "fast_inference": False, "max_lora_rank": 32}


@pytest.mark.parametrize(("card", "total", "weights", "share"), [
    ("L4", 23.6e9, "16bit", 0.69), ("T4", 15.8e9, "4bit", 0.5)])
def test_the_24gb_preset_loads_qwen3_4b_in_what_the_card_fits(monkeypatch, tmp_path, capsys, card, total, weights,
                                                              share):
    _a_card(monkeypatch, total, (8, 9) if card == "L4" else (7, 5))
    kwargs = presets.model_kwargs("24gb", qwen3_4b_config(tmp_path), fast_inference=True)
    assert kwargs["load_in_4bit"] == (weights == "4bit") and "load_in_fp8" not in kwargs
    assert kwargs["gpu_memory_utilization"] == round(share, 4)  # of the whole card: it is the preset's own size
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and said.startswith(f"agentenv_nb: vLLM generates from {weights[:-3]}-bit weights")
    assert "AGENTENV_NB_VLLM_WEIGHTS" in said  # and how to name another
    monkeypatch.setenv("AGENTENV_NB_VLLM_WEIGHTS", "4bit")  # the recipe's, whatever the card fits
    kwargs = presets.model_kwargs("24gb", qwen3_4b_config(tmp_path), fast_inference=True)
    assert kwargs["load_in_4bit"] and kwargs["gpu_memory_utilization"] == 0.5
    assert presets.vllm_weights(PRESETS["16bit"], "m") == "16bit"  # a preset that names its weights keeps them


def test_weights_named_in_the_environment_that_the_kit_doesnt_load_are_refused_at_once(monkeypatch):
    from agentenv_nb import settings

    monkeypatch.setenv("AGENTENV_NB_VLLM_WEIGHTS", "int8")
    with pytest.raises(settings.SettingError) as refused:
        settings.check_environment()  # as a command and AgentEnv.local do before anything starts
    assert str(refused.value).startswith("AGENTENV_NB_VLLM_WEIGHTS='int8' isn't one of 16bit, fp8, 4bit (")


def test_an_unknown_precision_is_refused_in_one_line():
    mine = dataclasses.replace(presets.PRESETS["24gb"], vllm_weights="int8")
    with pytest.raises(ValueError, match=r"vllm_weights='int8': choose 'auto' or one of \('16bit', 'fp8', '4bit'\)"):
        presets.model_kwargs(mine, "m", fast_inference=True, gpu_memory_utilization=0.25)


def _on_a_card(monkeypatch, capability):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.version, "cuda", "13.0")


@pytest.mark.slow  # imports Unsloth's model code
def test_unsloths_on_the_fly_fp8_starts_at_compute_capability_9(monkeypatch):
    """Unsloth 2026.10.9 checks the card as vLLM loads (FastLlamaModel.from_pretrained calls this gate with
    fast_inference) and refuses below 9.0: FP8_FROM is its gate. The gate also needs torchao 0.15+ installed."""
    import_unsloth()
    import torchao
    from packaging.version import Version
    from unsloth.models import loader_utils

    gate = loader_utils._get_fp8_mode_and_check_settings
    _on_a_card(monkeypatch, vllm_sizing.FP8_FROM)
    assert gate(True, fast_inference=True) == "row" and Version(torchao.__version__) >= Version("0.15.0")
    _on_a_card(monkeypatch, (8, 9))
    with pytest.raises(ValueError, match="requires H100 GPUs or after"):
        gate(True, fast_inference=True)
    with pytest.raises(ValueError, match="not compatible with `load_in_4bit`"):  # why fp8 turns load_in_4bit off
        gate(True, fast_inference=True, load_in_4bit=True)


@pytest.mark.slow  # imports Unsloth's model code
def test_unsloth_asks_vllm_0_29_for_its_online_per_channel_fp8():
    """load_in_fp8=True is "row": vLLM's own online fp8 (``quantization="fp8_per_channel"``, which vLLM 0.29 lists),
    not an offline torchao copy of the model, and the training model shares those fp8 weights (FP8Linear)."""
    import_unsloth()
    from unsloth_zoo import vllm_utils

    online = vllm_utils._get_vllm_online_fp8_quantization
    assert online("row", quantization_methods=["fp8", "fp8_per_channel", "fp8_per_block"],
                  device_capability=(9, 0)) == "fp8_per_channel"
    assert online("row", quantization_methods=["fp8"], device_capability=(9, 0)) is None  # then torchao's
