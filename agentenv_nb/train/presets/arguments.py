"""The arguments a preset gives Unsloth's loader, PEFT and TRL's trainers, and TRL's configs built from them
(``configs``: each checked to keep them). Pure functions of a preset and what ``choices`` decides here.

Every argument Unsloth's GRPOConfig/SFTConfig would change when left unset is set here, so a run's settings are TRL's
and the preset's, not silently Unsloth's. Left as Unsloth's: vllm_importance_sampling_correction False,
gradient_checkpointing_kwargs use_reentrant True, logging_nan_inf_filter False, eval_accumulation_steps 2,
torch_empty_cache_steps 250, router_aux_loss_coef 0.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agentenv_nb.stack import import_unsloth
from agentenv_nb.train.presets import choices, configs, vllm_sizing
from agentenv_nb.train.presets.recipes import Preset, named

TRAINERS = ("grpo", "async")  # the configs trainer_config builds; train.grpo.trainer.trainer_for makes their trainers

_EXPLICIT = {"report_to": "none", "logging_steps": 1}  # defaults Unsloth's config rewrite replaces, set back
# FastLanguageModel.from_pretrained's precision arguments for vLLM's weights (choices.vllm_weights)
_LOADED_IN = {"fp8": {"load_in_4bit": False, "load_in_fp8": True}, "16bit": {"load_in_4bit": False},
              "4bit": {"load_in_4bit": True}}


def model_kwargs(preset: Preset | str, model_name: str, **overrides: Any) -> dict:
    """Keyword arguments for ``FastLanguageModel.from_pretrained``; with vLLM, sized to the memory the run may use,
    its weights in the precision ``choices.vllm_weights`` says."""
    preset = named(preset)
    # An overriding fast_inference (the SFT stage's False) decides first: no vLLM sized, or asked about, for nothing
    use_vllm = overrides.pop("fast_inference") if "fast_inference" in overrides else choices.fast_inference(preset)
    kwargs = {"model_name": model_name, "max_seq_length": preset.max_seq_length, "load_in_4bit": preset.load_in_4bit,
              "fast_inference": use_vllm, "max_lora_rank": preset.lora_r}
    if use_vllm:
        weights = choices.vllm_weights(preset, model_name)
        kwargs.update(_LOADED_IN[weights])
        if "gpu_memory_utilization" not in overrides:  # a share of the WHOLE card
            kwargs["gpu_memory_utilization"] = choices.vllm_utilization(preset, weights)
    precision = choices.training_precision(preset, model=model_name)
    dtype = preset.dtype or {"fp16": "float16", "fp32": "float32"}.get(precision)  # else Unsloth's: bf16 from 8.0
    if dtype is not None:
        import torch

        kwargs["dtype"] = getattr(torch, dtype)
    return {**kwargs, **overrides}


def peft_kwargs(preset: Preset | str, **overrides: Any) -> dict:
    """Keyword arguments for ``FastLanguageModel.get_peft_model``: LoRA on the preset's layers."""
    preset = named(preset)
    kwargs = {"r": preset.lora_r, "lora_alpha": preset.lora_alpha, "target_modules": list(preset.lora_targets),
              "lora_dropout": 0.0, "use_gradient_checkpointing": preset.gradient_checkpointing,
              "random_state": preset.seed}
    return {**kwargs, **overrides}


def _checkpointing(output_dir: str, save_steps: int | None, resume: bool | str) -> dict:
    """Checkpoint arguments: every ``save_steps`` steps (or never), and the checkpoint to resume from. A resumed run
    skips ``eval_on_start``: its checkpoint's log already holds that eval, and a second one at the resumed step
    would put two points on the eval curve there. ``agentenv_nb.train.fit`` says what it resumes."""
    from transformers.trainer_utils import get_last_checkpoint

    if resume is True:
        resume = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    resuming = {"resume_from_checkpoint": resume, "eval_on_start": False} if resume else {}
    return {"output_dir": output_dir, "save_strategy": "steps" if save_steps else "no",
            "save_steps": save_steps or 500, "resume_from_checkpoint": None, **resuming}


def _named_as(preset: Preset, part: str, prefix: str = "") -> dict:
    """The settings of ``part`` under their argument names: a field's name without ``prefix``."""
    return {field.name.removeprefix(prefix): getattr(preset, field.name) for field in dataclasses.fields(preset)
            if field.metadata.get("part") == part}


def _shared(preset: Preset, model=None) -> dict:
    """What GRPO and SFT both take from a preset, for ``model`` (a name or a loaded model; None: any)."""
    precision = choices.training_precision(preset, model=model)
    return {**_EXPLICIT, **_named_as(preset, "trainer"), "bf16": precision == "bf16", "fp16": precision == "fp16"}


def _grpo_for_size(preset: Preset, model) -> dict:
    """GRPO's settings over the preset's for ``model``: a small model's ``small_*`` (``choices.small_model``)."""
    if not choices.small_model(preset, model):
        return {}
    return {"learning_rate": preset.small_learning_rate, "temperature": preset.small_temperature,
            "lr_scheduler_type": preset.small_lr_scheduler_type}


def grpo_temperature(preset: Preset | str, model=None) -> float:
    """The temperature GRPO samples ``model`` (a name or a loaded model) at: a small model's ``small_temperature``."""
    preset = named(preset)
    return _grpo_for_size(preset, model).get("temperature", preset.temperature)


def grpo_kwargs(preset: Preset | str, output_dir: str = "outputs", max_steps: int | None = None,
                save_steps: int | None = None, resume: bool | str = False, model_name: str | None = None,
                **overrides: Any) -> dict:
    """The GRPOConfig arguments of a preset; ``resume=True`` picks the last checkpoint in ``output_dir``; a small
    ``model_name`` (``choices.small_model``) gets the preset's ``small_learning_rate``, ``small_temperature`` and
    ``small_lr_scheduler_type``."""
    preset = named(preset)
    use_vllm = choices.fast_inference(preset)
    kwargs = _named_as(preset, "grpo")
    parts, thinking = kwargs.pop("generation_parts_without_vllm"), kwargs.pop("enable_thinking")
    kwargs = {
        **kwargs, **_shared(preset, model_name),
        "chat_template_kwargs": {"enable_thinking": thinking},
        "scale_rewards": "group",  # TRL's default: each group's advantages over its reward std
        "use_vllm": use_vllm,
        "eval_strategy": "steps",
        "eval_on_start": True,
    }
    if use_vllm:
        kwargs["vllm_mode"] = "colocate"  # Unsloth's vLLM shares the model's weights in this process
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    kwargs.update(_grpo_for_size(preset, model_name))
    if kwargs["eval_steps"] is None:
        kwargs["eval_steps"] = kwargs["max_steps"]  # evaluate at the start and at the end
    kwargs = {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}
    kwargs["scale_rewards"] = configs.scale_rewards_argument(kwargs["scale_rewards"], kwargs["loss_type"])
    if not use_vllm and parts > 1 and "steps_per_generation" not in overrides:
        kwargs["steps_per_generation"] = max(1, kwargs["gradient_accumulation_steps"] // parts)
    return kwargs


def sft_kwargs(preset: Preset | str, output_dir: str = "sft-outputs", max_steps: int | None = None,
               save_steps: int | None = None, resume: bool | str = False, model=None,
               longest_tokens: int | None = None, **overrides: Any) -> dict:
    """The SFTConfig arguments of a preset's warm start: assistant-only loss on chats with tool calls; a small
    ``model`` (a name or a loaded model, ``choices.small_model``) gets the preset's ``small_sft_*``, a pretrained one
    on a preset made for the tiny model its ``pretrained_sft_*`` (``choices.pretrained``). With a loaded ``model``
    and its demonstrations' ``longest_tokens``, a micro-batch holds no more conversations than their logits leave
    room for on this GPU (``choices.sft_micro_batch``, said in one line)."""
    preset = named(preset)
    kwargs = {
        **_named_as(preset, "sft", prefix="sft_"), **_shared(preset, model),
        "assistant_only_loss": True,  # learn the model's turns (tool calls, answers), not prompts or tool results
        "loss_type": "nll",  # Unsloth's SFT default too; TRL's is chunked_nll
        "packing": False,
        "padding_free": False,
        "eval_strategy": "no",
    }
    if choices.small_model(preset, model):
        kwargs.update(num_train_epochs=preset.small_sft_num_train_epochs, learning_rate=preset.small_sft_learning_rate,
                      per_device_train_batch_size=preset.small_sft_per_device_train_batch_size,
                      gradient_accumulation_steps=preset.small_sft_gradient_accumulation_steps)
    if choices.pretrained(preset, model):
        kwargs.update(max_steps=preset.pretrained_sft_max_steps, learning_rate=preset.pretrained_sft_learning_rate)
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    if longest_tokens and hasattr(model, "get_output_embeddings"):
        batch, accumulation, line = choices.sft_micro_batch(
            kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"],
            min(longest_tokens, kwargs["max_length"]), model.get_output_embeddings().weight.shape[0],
            vllm_sizing.free_for_training())
        kwargs.update(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation)
        if line:
            print(line)
    return {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}


def async_grpo_kwargs(preset: Preset | str, output_dir: str = "outputs", max_steps: int | None = None,
                      save_steps: int | None = None, resume: bool | str = False, model_name: str | None = None,
                      **overrides: Any) -> dict:
    """The AsyncGRPOConfig arguments of a preset (``train.grpo.trainer.async_grpo_trainer``): its GRPO settings that
    TRL's AsyncGRPOTrainer takes. That trainer has a loss of its own (each token's clipped ratio over the step's
    tokens: no loss_type, scale_rewards or beta, which the recipe sets to 0), generates ahead (``max_staleness``)
    instead of ``steps_per_generation``, and has no eval loop. Its step trains on the preset's rollouts, a
    micro-batch of ``per_device_train_batch_size`` each (``token_budget=0``), where TRL's default would pack rows of
    vLLM's ``max_model_len`` tokens instead: fewer rollouts a step. Rollouts in flight, each an env session: a
    step's."""
    import_unsloth()  # before trl
    from trl.experimental.async_grpo import AsyncGRPOConfig

    kwargs = grpo_kwargs(preset, output_dir, max_steps, save_steps, resume, model_name)
    taken = {field.name for field in dataclasses.fields(AsyncGRPOConfig)}
    kwargs = {name: value for name, value in kwargs.items() if name in taken}
    kwargs = {**kwargs, "eval_strategy": "no", "eval_on_start": False, "token_budget": 0, **overrides}
    kwargs.setdefault("max_inflight_tasks",
                      kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"])
    return kwargs


def grpo_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.GRPOConfig`` for ``preset`` (arguments as ``grpo_kwargs``); imports unsloth first."""
    return configs.build("GRPOConfig", grpo_kwargs(preset, **kwargs))


def async_grpo_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.experimental.async_grpo.AsyncGRPOConfig`` for ``preset`` (arguments as
    ``async_grpo_kwargs``); imports unsloth first."""
    return configs.build("AsyncGRPOConfig", async_grpo_kwargs(preset, **kwargs))


def sft_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.SFTConfig`` for ``preset`` (arguments as ``sft_kwargs``); imports unsloth first."""
    return configs.build("SFTConfig", sft_kwargs(preset, **kwargs))


def trainer_config(trainer: str, preset: Preset | str, **kwargs: Any):
    """The checked config of ``trainer`` (one of ``TRAINERS``: "grpo", ``grpo_config``; "async",
    ``async_grpo_config``) for ``preset``; ``train.grpo.trainer.trainer_for`` makes the trainer it configures."""

    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; choose one of {TRAINERS}")
    return (async_grpo_config if trainer == "async" else grpo_config)(preset, **kwargs)
