"""What a preset becomes on this machine and for this model, each decided in one function every caller uses: whether
vLLM generates here (``fast_inference``), the precision of its weights (``vllm_weights``: as the model loads and as
preflight counts the memory), the GPU memory the run needs (``gpu_need_gb``), the training precision, torch's threads,
what trains in full, and whether a model gets the preset's small-model settings (``small_model``: for SFT and GRPO
alike); and the preset's settings as a table, with what a run's config and model became (``table``). Each takes
the ``Preset`` its run resolved once (``recipes.named``); ``table``, a view, takes a name too.

    preset = presets.named("24gb")
    presets.vllm_weights(preset, "unsloth/Qwen3-4B")   # "16bit" on an L4: its weights and a step's KV cache fit
    presets.gpu_need_gb(preset, "unsloth/Qwen3-4B")    # the GB free the GRPO run needs here
    presets.small_model(preset, model)                 # a folder, a Hub id or a loaded model: the same answer
"""

from __future__ import annotations

import dataclasses
import enum
import functools

from agentenv_nb import settings
from agentenv_nb.stack import vllm_available
from agentenv_nb.train.presets import vllm_sizing
from agentenv_nb.train.presets.recipes import AUTO, PARTS, Preset, named


@functools.cache
def _vllm_generates() -> bool:
    """Whether Unsloth's vLLM runs here (``host.plan.engine_for``); says once why not."""
    from agentenv_nb.host.plan import engine_for, plan_here

    ok, why = engine_for(plan_here().host, vllm_available)
    if not ok:
        print(f"agentenv_nb: fast_inference=False ({why}); generating with transformers' generate instead.")
    return ok


def fast_inference(preset: Preset) -> bool:
    """Whether a preset generates on Unsloth's colocated vLLM: where it asks to and vLLM imports."""
    return preset.vllm and _vllm_generates()


@functools.cache
def _say(line: str) -> None:
    print(line)


def vllm_weights(preset: Preset, model_name: str | None = None) -> str | None:
    """The precision vLLM generates ``model_name`` in for ``preset`` (one of ``vllm_sizing.WEIGHTS``), which the
    model loads in (``model_kwargs``) and preflight counts the memory of (``gpu_need_gb``): the preset's own, else
    AGENTENV_NB_VLLM_WEIGHTS, else the fastest that fits this card, said in one line (once). None where the card
    would choose and no model is named."""
    if preset.vllm_weights not in (AUTO, *vllm_sizing.WEIGHTS):
        raise ValueError(f"vllm_weights={preset.vllm_weights!r}: choose 'auto' or one of {vllm_sizing.WEIGHTS}")
    if preset.vllm_weights != AUTO:
        return preset.vllm_weights
    if (named_here := settings.get("vllm_weights")) or model_name is None:
        return named_here
    import torch

    card = vllm_sizing.gpu_memory()[0]
    rollouts = preset.per_device_train_batch_size * preset.gradient_accumulation_steps  # generated at once
    choice, why = vllm_sizing.choose_weights(
        torch.cuda.get_device_capability(vllm_sizing.this_gpu()), card * vllm_utilization(preset, "16bit"),
        vllm_sizing.weights_16bit_bytes(model_name),
        vllm_sizing.kv_cache_bytes(model_name, rollouts * preset.max_completion_length))
    _say(f"agentenv_nb: vLLM generates from {why}. Name another with AGENTENV_NB_VLLM_WEIGHTS or "
         f"dataclasses.replace(preset, vllm_weights=...), one of {vllm_sizing.WEIGHTS}.")
    return choice


def vllm_utilization(preset: Preset, weights: str) -> float:
    """vLLM's ``gpu_memory_utilization`` for ``preset`` with weights in ``weights``: its share of the memory the run
    may use, as a share of the whole card."""
    share = preset.vllm_share_16bit if weights == "16bit" else preset.vllm_share
    return vllm_sizing.gpu_memory_utilization(share, *vllm_sizing.gpu_memory(), made_for_bytes=preset.gpu_gb * 1e9)


def gpu_need_gb(preset: Preset, model_name: str | None = None, *, weights: str | None = None,
                vllm: bool | None = None) -> float:
    """The free GPU memory ``preset``'s GRPO run on ``model_name`` needs here: less where it generates without vLLM
    (``vllm``; None: where it does here), or from 4-bit or fp8 weights (``weights``; None: ``vllm_weights``'s, and
    16-bit's where that is the card's to choose and no model is named)."""
    if not (fast_inference(preset) if vllm is None else vllm):
        return preset.gpu_need_gb_without_vllm
    quantized = (weights or vllm_weights(preset, model_name)) in ("4bit", "fp8")
    return preset.gpu_need_gb_quantized if quantized else preset.gpu_need_gb


FLOAT16_REFUSED = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})
"""Model types vLLM refuses to run in float16, for numerical instability (``_FLOAT16_NOT_SUPPORTED_MODELS`` in
vllm/config/model.py, https://github.com/vllm-project/vllm): they train and generate in bf16, or fp32 where the card
has no bf16 (a T4)."""


def training_precision(preset: Preset, host=None, model=None) -> str:
    """The precision ``preset`` trains ``model`` (as ``small_model`` takes it; None: any) in: its own, else
    AGENTENV_NB_PRECISION, else the card's (``host.plan``) of ``host`` (a ``host.probe.Host``; None: this machine);
    fp32 in place of fp16 for a family that fp16 breaks (``FLOAT16_REFUSED``), said in one line."""
    from agentenv_nb.host.plan import plan_here, precision_for

    if preset.precision != AUTO:
        precision = preset.precision
    else:
        precision = settings.get("precision") or precision_for(host or plan_here().host)
    if precision == "fp16" and model is not None and (family := _model_type(model)) in FLOAT16_REFUSED:
        _say(f"agentenv_nb: trains in fp32, not fp16: vLLM refuses float16 for {family} models (numerical "
             "instability), and this card has no bf16")
        return "fp32"
    return precision


def _model_type(model) -> str | None:
    """``model``'s ``config.model_type``: a loaded model's, or read from a folder's or a Hub id's config; None where
    no config can be read (no such model, or no network to the Hub): the load that follows says why."""
    from transformers import AutoConfig

    if hasattr(model, "config"):
        return model.config.model_type
    try:
        return AutoConfig.from_pretrained(model).model_type
    except (OSError, ValueError):
        return None


def torch_threads(preset: Preset) -> int | None:
    """Torch's CPU threads for a preset, or None for torch's default."""
    return preset.torch_threads


def full_finetuning(preset: Preset, stage: str, model=None) -> bool:
    """Whether ``stage`` ("sft" or "grpo") trains every weight of ``model`` rather than LoRA: a preset's full SFT is
    for the tiny random model, not a pretrained one (``pretrained``)."""
    return stage == "sft" and preset.full_finetuning_sft and not pretrained(preset, model)


def pretrained(preset: Preset, model) -> bool:
    """Whether ``model`` (as ``small_model`` takes it) gets ``preset``'s ``pretrained_*`` settings: at least
    ``pretrained_from`` parameters, where the preset is made for the tiny random model."""
    start = preset.pretrained_from
    return start is not None and model is not None and vllm_sizing.parameter_count(model) >= start


def size_problem(preset: Preset, model) -> str | None:
    """Why ``preset`` can't train ``model`` (as ``small_model`` takes it) here in reasonable time, in one line that
    says what to do; None where it can."""
    if preset.largest_model is None or (count := vllm_sizing.parameter_count(model)) <= preset.largest_model:
        return None
    return (f"the model has {count / 1e9:.1f}B parameters, more than the '{preset.name}' preset trains on this machine "
            f"in reasonable time (up to {preset.largest_model / 1e9:g}B): train it on a GPU preset ('16gb' on Colab's "
            "T4, '24gb'), or bring a smaller model")


def small_model(preset: Preset, model) -> bool:
    """Whether ``model`` (a folder, a Hub id or a loaded model; None: none named) gets ``preset``'s ``small_*``
    settings: fewer than ``small_model_below`` parameters, counted from its config (``vllm_sizing.parameter_count``),
    so a loaded model's SFT and its saved folder's GRPO decide alike, whatever LoRA or 4-bit packing it holds."""
    below = preset.small_model_below
    return bool(below) and model is not None and vllm_sizing.parameter_count(model) < below


LOGITS_SHARE = 0.5  # of the GPU memory free as SFT starts, what a micro-batch's logits may take: the rest holds
                   # their gradient and the activations


def sft_micro_batch(batch: int, accumulation: int, longest_tokens: int, vocab: int,
                    free_bytes: float | None) -> tuple[int, int, str]:
    """SFT's conversations a micro-batch and micro-batches a step, where a micro-batch's float32 logits (``batch`` x
    ``longest_tokens`` x ``vocab`` x 4 bytes: a 262k-token vocabulary makes them 5x a 49k one's) must fit
    ``LOGITS_SHARE`` of ``free_bytes`` (None: no GPU, no limit): the most conversations that fit, of those dividing
    a step's, with the accumulation raised to keep a step's; and the line saying so where they changed ("" where
    not). At one a micro-batch that doesn't fit, the line says to shorten the conversations."""
    if free_bytes is None:
        return batch, accumulation, ""
    room, rows = LOGITS_SHARE * free_bytes, batch * accumulation
    logits = longest_tokens * vocab * 4

    def gb(n: int) -> str:
        return f"{n * logits / 1e9:.1f} GB"

    if batch * logits <= room:
        return batch, accumulation, ""
    fits = [b for b in range(batch - 1, 0, -1) if rows % b == 0 and b * logits <= room]
    why = (f"{batch} conversations of up to {longest_tokens} tokens a micro-batch make {gb(batch)} of logits over "
           f"the model's {vocab:,}-token vocabulary, more than {room / 1e9:.1f} GB ({LOGITS_SHARE:.0%} of the "
           f"{free_bytes / 1e9:.1f} GB free)")
    if not fits:
        return 1, rows, (f"SFT: {why}; even one ({gb(1)}) may not fit: lower sft_max_length "
                         "(dataclasses.replace(preset, sft_max_length=...)) or train on a larger card")
    return fits[0], rows // fits[0], (f"SFT: {why}: {fits[0]} a micro-batch ({gb(fits[0])}) and "
                                      f"{rows // fits[0]} micro-batches a step, the same {rows} conversations a step")


def table(preset: Preset | str, config=None, model=None):
    """Every setting of ``preset`` by part, as a pandas DataFrame; with a GRPOConfig built from it (``grpo_config``),
    also what that config holds of each GRPO setting (enums by value): the run's own arguments, such as
    ``max_steps``, show there; with the model ``loading.load_model`` loaded, what it was loaded as (``load_in_4bit``,
    ``vllm``), which the card's choice of vLLM's weights decides, and the precision it trains in (its family's)."""
    import pandas as pd

    preset = named(preset)  # a user's view: a name will do
    rows = sorted(([field.metadata["part"], field.name, getattr(preset, field.name)]
                   for field in dataclasses.fields(preset) if "part" in field.metadata),
                  key=lambda row: PARTS.index(row[0]))
    held = {} if config is None else {row[1]: getattr(config, row[1], "") for row in rows
                                      if row[0] in ("grpo", "trainer")}
    if model is not None:
        from agentenv_nb.train.rollout import generator

        held.update(load_in_4bit=any(type(module).__name__ == "Linear4bit" for module in model.modules()),
                    vllm=generator(model) == "vllm", precision=training_precision(preset, model=model))
    columns = ["part", "setting", "preset"]
    if config is not None or model is not None:
        columns.append("config")
        for row in rows:
            value = held.get(row[1], "")
            row.append(value.value if isinstance(value, enum.Enum) else value)
    # the preset's name in the header row's corner, above the settings: an index name would get a header row of its own
    return pd.DataFrame(rows, columns=columns).set_index("setting").rename_axis(index=None, columns=preset.name)
