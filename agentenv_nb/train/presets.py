"""The trainer settings, in one place: model loading, LoRA, GRPO and the SFT warm start, per hardware preset.

``"24gb"`` is the Unsloth GridSim recipe (https://www.agentenvframework.com/docs/training/unsloth) on a 24 GB GPU
(4-bit QLoRA), ``"16bit"`` the same in 16-bit LoRA (the L40S row), ``"cpu-tiny"`` the same recipe shrunk for the
tiny offline model on a CPU (only: on a GPU, Unsloth turns bf16 autocast on for the float32 tiny model). Every
argument Unsloth's GRPOConfig/SFTConfig would change when left unset is set here, and each config is checked after
it is built, so a run's settings are TRL's and ours, not silently Unsloth's. Left as Unsloth's, as in the recipe's
runs: vllm_importance_sampling_correction False, gradient_checkpointing_kwargs use_reentrant True,
logging_nan_inf_filter False, eval_accumulation_steps 2, torch_empty_cache_steps 250, router_aux_loss_coef 0.

Usage::

    from agentenv_nb.train import presets

    config = presets.grpo_config("24gb", output_dir="out", max_steps=40, save_steps=10)  # imports unsloth first
    from unsloth import FastLanguageModel
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("24gb", "qwen3-4b-gridsim-sft"))
    model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs("24gb"))
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from agentenv_nb.stack import import_unsloth, vllm_available
from agentenv_nb.train import vllm_sizing

PRESETS = ("24gb", "16bit", "cpu-tiny")
GPU_NEED_GB = {  # free GPU memory a preset's GRPO run needs: (with Unsloth's vLLM, with transformers' generate)
    "24gb": (19.0, 13.0),  # the recipe's L4 run: the whole process's peak measured in docs/benchmarks.md
    "16bit": (40.0, 25.0),  # the recipe's L40S run, vLLM taking half; likewise
    "cpu-tiny": (0.0, 0.0),
}
PRESET_GPU_GB = {"24gb": 24.0, "16bit": 48.0}  # the card each GPU preset is made for (an L4, an L40S): vLLM is sized
VLLM_SHARE = 0.5  # for at most that, taking the recipe's half of the memory a run may use (vllm_sizing)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Arguments whose default Unsloth's config rewrite changes (the recipe page's "Settings Unsloth changes"), plus the
# other defaults its rewrite replaces in the same list; each is passed explicitly by every preset below.
_EXPLICIT = {
    "optim": "adamw_torch",  # Unsloth's default: adamw_8bit. The same AdamW as TRL's fused one, unfused
    "weight_decay": 0.0,  # Unsloth's: 0.001
    "seed": 0,  # Unsloth's: 3407
    "report_to": "none",
    "logging_steps": 1,
}


def _check_preset(preset: str) -> None:
    """Refuse a preset name this module doesn't define."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS}")


@functools.cache
def fast_inference(preset: str) -> bool:
    """Whether a preset generates on Unsloth's colocated vLLM: GPU presets do when vLLM imports; says why not."""
    _check_preset(preset)
    if preset == "cpu-tiny":
        return False
    ok, why = vllm_available()
    if not ok:
        print(f"agentenv_nb: fast_inference=False ({why}); generating with transformers' generate instead.")
    return ok


def gpu_need_gb(preset: str) -> float:
    """The free GPU memory ``preset``'s GRPO run needs here: less where it generates without vLLM."""
    return GPU_NEED_GB[preset][0 if fast_inference(preset) else 1]


def model_kwargs(preset: str, model_name: str, **overrides: Any) -> dict:
    """Keyword arguments for ``FastLanguageModel.from_pretrained``; with vLLM, sized to the memory the run may use."""
    _check_preset(preset)
    kwargs = {"model_name": model_name, "max_seq_length": 4096, "load_in_4bit": preset == "24gb",
              "fast_inference": fast_inference(preset), "max_lora_rank": 32}
    if kwargs["fast_inference"] and "gpu_memory_utilization" not in overrides:  # a share of the WHOLE card
        kwargs["gpu_memory_utilization"] = vllm_sizing.gpu_memory_utilization(
            VLLM_SHARE, *vllm_sizing.gpu_memory(), made_for_bytes=PRESET_GPU_GB[preset] * 1e9)
    if preset == "cpu-tiny":
        import torch

        kwargs.update(max_seq_length=1024, dtype=torch.float32)  # Unsloth's GPU loader takes no dtype names
    return {**kwargs, **overrides}


def full_finetuning(preset: str, stage: str) -> bool:
    """Whether ``stage`` ("sft" or "grpo") trains every weight rather than LoRA: only the tiny model's SFT, since
    LoRA over a random model's frozen embeddings can't teach it to write a tool call."""
    _check_preset(preset)
    return preset == "cpu-tiny" and stage == "sft"


def torch_threads(preset: str) -> int | None:
    """Torch's CPU threads for a preset, or None for torch's default: one for "cpu-tiny", whose small CPU host also
    runs the envs and their server, which more threads spin against (docs/benchmarks.md)."""
    _check_preset(preset)
    return 1 if preset == "cpu-tiny" else None


def peft_kwargs(preset: str, **overrides: Any) -> dict:
    """Keyword arguments for ``FastLanguageModel.get_peft_model``: LoRA r32/alpha64 on every linear layer."""
    _check_preset(preset)
    kwargs = {"r": 32, "lora_alpha": 64, "target_modules": list(LORA_TARGETS), "lora_dropout": 0.0,
              "use_gradient_checkpointing": "unsloth" if preset != "cpu-tiny" else False, "random_state": 0}
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


def grpo_kwargs(preset: str, output_dir: str = "outputs", max_steps: int | None = None,
                save_steps: int | None = None, resume: bool | str = False, **overrides: Any) -> dict:
    """The GRPOConfig arguments of a preset; ``resume=True`` picks the last checkpoint in ``output_dir``."""
    _check_preset(preset)
    unsloth_rewrites = _unsloth_rewrites_configs()
    use_vllm = fast_inference(preset)
    kwargs = {
        **_EXPLICIT,
        "max_steps": 40,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,  # 32 rollouts a step: 4 tasks, 8 rollouts each
        "num_generations": 8,
        "max_completion_length": 1024,  # the whole conversation: tool calls and their results too
        "max_tool_calling_iterations": 2,
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 1.1,
        "learning_rate": 2e-5,  # Unsloth's default: 5e-5
        "lr_scheduler_type": "cosine",
        "warmup_steps": 3,  # Unsloth's default: 10% of the steps
        "loss_type": "dr_grpo",
        # TRL's group scaling. Unsloth's rewrite turns "group"/True off for dr_grpo; only None keeps it
        # (and becomes "group"). Stock TRL rejects None at the first step, so it gets "group" itself.
        "scale_rewards": None if unsloth_rewrites else "group",
        "beta": 0.0,
        "epsilon_high": 0.28,
        "use_vllm": use_vllm,
        "bf16": True,
        "fp16": False,
        "eval_strategy": "steps",
        "eval_steps": 20,
        "eval_on_start": True,
        "num_generations_eval": 1,
        "per_device_eval_batch_size": 32,  # Unsloth's default: 4
    }
    if use_vllm:
        kwargs["vllm_mode"] = "colocate"  # Unsloth's vLLM shares the model's weights in this process
    if preset == "cpu-tiny":
        kwargs.update(
            max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,  # 2 tasks x 4 rollouts
            num_generations=4, max_completion_length=512,  # 512 holds the whole GridSim conversation: two tool
            # calls, the prices they return, and end_turn
            warmup_steps=0, bf16=False, per_device_eval_batch_size=4,
            # cooler and slower than the recipe: the tiny warm start's groups keep a spread, and GRPO doesn't undo it
            temperature=0.8, learning_rate=3e-4)
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    if preset == "cpu-tiny":
        kwargs["eval_steps"] = kwargs["max_steps"]  # evaluate at the start and at the end
    kwargs = {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}
    if preset == "24gb" and not use_vllm and "steps_per_generation" not in overrides:
        # transformers' generate (Unsloth's without vLLM) holds the KV cache of every rollout it generates at once:
        # a step's 32 in two batches of 16 fit a 24 GB card (docs/benchmarks.md); each optimizer step still takes 32
        # rollouts of one policy
        kwargs["steps_per_generation"] = max(1, kwargs["gradient_accumulation_steps"] // 2)
    return kwargs


def sft_kwargs(preset: str, output_dir: str = "sft-outputs", max_steps: int | None = None,
               save_steps: int | None = None, resume: bool | str = False, **overrides: Any) -> dict:
    """The SFTConfig arguments of a preset's warm start: assistant-only loss on chats with tool calls."""
    _check_preset(preset)
    kwargs = {
        **_EXPLICIT,
        "num_train_epochs": 1,
        "max_steps": -1,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-4,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 5,
        "assistant_only_loss": True,  # learn the model's turns (tool calls, answers), not prompts or tool results
        "loss_type": "nll",  # Unsloth's SFT default too; TRL's is chunked_nll
        "max_length": 4096,
        "packing": False,
        "padding_free": False,
        "bf16": True,
        "fp16": False,
        "eval_strategy": "no",
    }
    if preset == "cpu-tiny":
        # 400 conversations, two a step: the expert's 16 demonstrations 25 times over (a CPU's cost is per conversation,
        # batched or not). Enough for the tool calls and a valid 24-hour schedule with every seed tried (0-6)
        kwargs.update(max_steps=200, per_device_train_batch_size=2, gradient_accumulation_steps=1,
                      learning_rate=3e-3, warmup_steps=0, max_length=1024, bf16=False)
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    return {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}


def grpo_config(preset: str, **kwargs: Any):
    """A checked ``trl.GRPOConfig`` for ``preset`` (arguments as ``grpo_kwargs``); imports unsloth first."""
    return _checked("GRPOConfig", grpo_kwargs(preset, **kwargs))


def sft_config(preset: str, **kwargs: Any):
    """A checked ``trl.SFTConfig`` for ``preset`` (arguments as ``sft_kwargs``); imports unsloth first."""
    return _checked("SFTConfig", sft_kwargs(preset, **kwargs))


def _checked(config_class: str, expected: dict):
    """TRL's ``config_class`` (Unsloth's rewrite, on a GPU) made from ``expected``, checked to keep every setting."""
    import_unsloth()
    import trl

    config = getattr(trl, config_class)(**expected)
    check_config(config, expected)
    return config


def _unsloth_rewrites_configs() -> bool:
    """Whether ``trl.GRPOConfig`` is Unsloth's rewrite (on a GPU), not stock TRL (on a CPU)."""
    import_unsloth()
    import trl

    return _stock_class(trl.GRPOConfig) is not trl.GRPOConfig


def _stock_class(cls: type) -> type:
    """TRL's own config class under an Unsloth rewrite, or ``cls`` itself.

    Unsloth's class subclasses TRL's and takes its module and name, so it is told apart by the
    ``unsloth_*`` fields it adds (``unsloth_num_chunks``, ...).
    """
    return next(c for c in cls.__mro__
                if not any(name.startswith("unsloth_") for name in getattr(c, "__dataclass_fields__", {})))


def config_drift(config, expected) -> dict[str, tuple]:
    """Settings whose value in ``config`` differs from ``expected``: {name: (expected, actual)}.

    ``expected`` is either the arguments a config was built from, compared as TRL's own config class
    makes them (its enums, "group"), or an earlier copy of the config, compared field by field: a
    ``copy.deepcopy(config)`` taken before a trainer is built shows what the trainer changed. Build
    from arguments only before any trainer exists: a new TrainingArguments resets accelerate's state.
    """
    if isinstance(expected, dict):
        stock = dict(expected)
        if stock.get("scale_rewards", "group") is None:
            stock["scale_rewards"] = "group"  # what Unsloth's None means: TRL's default scaling
        reference, names = _stock_class(type(config))(**stock), list(expected)
    else:
        reference, names = expected, [field.name for field in dataclasses.fields(expected)]
    return {name: (getattr(reference, name), getattr(config, name)) for name in names
            if getattr(reference, name) != getattr(config, name)}


def check_config(config, expected) -> None:
    """Raise if ``config`` lost any setting of ``expected`` (see ``config_drift``), e.g. to Unsloth's rewrite."""
    drift = config_drift(config, expected)
    if drift:
        lines = "\n".join(f"  {name}: set {want!r}, got {got!r}" for name, (want, got) in drift.items())
        raise ValueError(f"the trainer config does not keep these settings:\n{lines}")
