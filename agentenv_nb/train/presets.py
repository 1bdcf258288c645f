"""The trainer settings as data: one frozen ``Preset`` a hardware target, in one table, ``PRESETS``; the model, LoRA,
GRPO and SFT arguments are pure functions of a preset.

``"24gb"`` is the Unsloth GridSim recipe (https://www.agentenvframework.com/docs/training/unsloth) on a 24 GB GPU
(4-bit QLoRA, vLLM generating from the same 4-bit weights; 16-bit or fp8 weights instead where they fit the card,
being faster), and ``Preset``'s defaults are its settings; ``"16bit"`` is the same in 16-bit LoRA (the L40S row),
``"16gb"`` the same for a 16 GB card (a T4 on Colab or Kaggle, in fp16: 16 rollouts a step), ``"cpu-tiny"`` the same
recipe shrunk for the tiny offline model on a CPU (only: on a GPU, Unsloth turns bf16 autocast on for the float32
tiny model). ``"auto"`` is the one that fits this host's card (``host.plan``). Every argument Unsloth's GRPOConfig/SFTConfig would change when left unset
is set here, and each config is checked after it is built (``configs``), so a run's settings are TRL's and ours, not
silently Unsloth's. Left as Unsloth's, as in the recipe's runs: vllm_importance_sampling_correction False,
gradient_checkpointing_kwargs use_reentrant True, logging_nan_inf_filter False, eval_accumulation_steps 2,
torch_empty_cache_steps 250, router_aux_loss_coef 0.

Usage::

    from agentenv_nb.train import presets

    presets.table("24gb")                                         # every setting of a preset, by part
    presets.table("24gb", config, model)           # and what the run's config holds, and the model was loaded as
    presets.differences(presets.PRESETS["24gb"], presets.PRESETS["cpu-tiny"])
    mine = dataclasses.replace(presets.PRESETS["24gb"], temperature=1.0, max_steps=80)   # a preset of your own
    config = presets.grpo_config(mine, output_dir="out", save_steps=10)   # a name or a Preset; imports unsloth first
    config = presets.trainer_config("async", mine, output_dir="out")      # a trainer's config: "grpo" or "async"
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs(mine, "qwen3-4b-gridsim-sft"))
    model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs(mine))
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from typing import Any

from agentenv_nb import settings
from agentenv_nb.stack import import_unsloth, vllm_available
from agentenv_nb.train import configs
from agentenv_nb.train.model import vllm_sizing

# Where a setting goes; "small": the SFT of a small model, "trainer": GRPO's and SFT's
PARTS = ("machine", "model", "lora", "grpo", "sft", "small", "trainer")


def _part(name: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"part": name})


@dataclasses.dataclass(frozen=True)
class Preset:
    """Every setting a preset decides, with the recipe's on a 24 GB GPU as the defaults. Fields named as a TRL,
    Unsloth or PEFT argument are that argument; ``sft_*`` are SFTConfig's of the same name without the prefix."""

    name: str
    # The machine it is made for
    gpu_gb: float | None = _part("machine", 24.0)  # the card (an L4); vLLM gets at most a share of it. None: a CPU
    gpu_need_gb: float = _part("machine", 21.0)  # free GPU memory the GRPO run needs with vLLM's 16-bit weights:
    # the whole process's peak, measured in docs/benchmarks.md (Qwen3-4B: 20.8 GiB)
    gpu_need_gb_quantized: float = _part("machine", 17.0)  # the same with 4-bit or fp8 weights (16.6 and 16.7 GiB)
    gpu_need_gb_without_vllm: float = _part("machine", 13.0)  # the same with transformers' generate
    torch_threads: int | None = _part("machine", None)  # torch's CPU threads; None: torch's default
    precision: str = _part("machine", "auto")  # "bf16", "fp16", "fp32", or "auto": bf16 where the card computes in it
    # (compute capability 8.0 on), else fp16 (a T4), or AGENTENV_NB_PRECISION where that is set
    # FastLanguageModel.from_pretrained
    load_in_4bit: bool = _part("model", True)
    max_seq_length: int = _part("model", 4096)
    dtype: str | None = _part("model", None)  # a torch dtype's name; None: Unsloth's (its GPU loader takes no names)
    vllm: bool = _part("model", True)  # fast_inference: generate on Unsloth's colocated vLLM, where vLLM imports
    vllm_share: float = _part("model", 0.5)  # of the memory the run may use, vLLM's with 4-bit or fp8 weights: the
    # recipe's gpu_memory_utilization, taken of at most gpu_gb (vllm_sizing)
    vllm_share_16bit: float = _part("model", 0.69)  # the same with 16-bit weights, 8 GB of Qwen3-4B: beside them a
    # KV cache for all 32 rollouts at once; its GRPO step's whole process peaked at 22.3 GB (docs/benchmarks.md)
    vllm_weights: str = _part("model", "auto")  # with vLLM, the weights it generates from and LoRA trains on: "4bit"
    # (the recipe's), "16bit", "fp8", or "auto": the fastest that fits this card, said in one line (vllm_sizing), or
    # AGENTENV_NB_VLLM_WEIGHTS where that is set.
    # Without vLLM, load_in_4bit's. On the H200 held to 24 GB, the Qwen3-4B shape's GRPO step took 12.0 s in 16-bit,
    # 16.2 s in fp8 and 18.7 s in 4-bit (docs/benchmarks.md)
    # FastLanguageModel.get_peft_model
    lora_r: int = _part("lora", 32)
    lora_alpha: int = _part("lora", 64)
    lora_targets: tuple[str, ...] = _part("lora", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"))  # every linear layer
    gradient_checkpointing: str | bool = _part("lora", "unsloth")
    full_finetuning_sft: bool = _part("lora", False)  # the SFT warm start trains every weight instead of LoRA
    # GRPOConfig
    max_steps: int = _part("grpo", 40)
    per_device_train_batch_size: int = _part("grpo", 8)
    gradient_accumulation_steps: int = _part("grpo", 4)  # 32 rollouts a step: 4 tasks, 8 rollouts each
    num_generations: int = _part("grpo", 8)
    generation_parts_without_vllm: int = _part("grpo", 2)  # transformers' generate holds the KV cache of every
    # rollout it generates at once: a step's 32 in two parts of 16 fit a 24 GB card (docs/benchmarks.md); each
    # optimizer step still takes 32 rollouts of one policy (steps_per_generation)
    max_completion_length: int = _part("grpo", 1024)  # the whole conversation: tool calls and their results too
    max_tool_calling_iterations: int = _part("grpo", 2)
    enable_thinking: bool = _part("grpo", False)  # the chat template's; on, Qwen3-4B thinks past 6,144 tokens
    temperature: float = _part("grpo", 1.1)
    learning_rate: float = _part("grpo", 2e-5)  # Unsloth's default: 5e-5
    warmup_steps: int = _part("grpo", 3)  # Unsloth's default: 10% of the steps
    loss_type: str = _part("grpo", "dr_grpo")
    beta: float = _part("grpo", 0.0)
    epsilon_high: float = _part("grpo", 0.28)
    eval_steps: int | None = _part("grpo", 20)  # None: at the start and the end only
    per_device_eval_batch_size: int = _part("grpo", 32)  # Unsloth's default: 4
    num_generations_eval: int = _part("grpo", 1)
    # SFTConfig: assistant-only loss on chats with tool calls
    sft_max_steps: int = _part("sft", -1)  # -1: sft_num_train_epochs
    sft_num_train_epochs: int = _part("sft", 1)
    sft_per_device_train_batch_size: int = _part("sft", 4)
    sft_gradient_accumulation_steps: int = _part("sft", 4)
    sft_per_device_eval_batch_size: int = _part("sft", 8)
    sft_learning_rate: float = _part("sft", 1e-4)
    sft_warmup_steps: int = _part("sft", 5)
    sft_max_length: int = _part("sft", 4096)
    # A small model's SFT warm start and GRPO. The recipe's SFT (one epoch at 1e-4) is made for Qwen3-4B:
    # SmolLM2-135M-Instruct on 200 GridSim expert demonstrations (an H200, 4-bit) called no tool after it (reward 0.0),
    # made the calls but no valid schedule after four epochs at 1e-4 (0.0), and scored 0.79 on 40 eval days after six
    # epochs at 1e-3, twice. On 100 demonstrations those six epochs taught the calls (two a rollout) but scored 0.15 in
    # 4-bit and 0.0 in 16-bit: give it 200 or more; 400 scored 0.756 on 200 eval days, the greedy rule's level, as 200
    # did (docs/benchmarks.md).
    small_model_below: float | None = _part("small", 1e9)  # parameters; None: every model gets sft_* above
    small_sft_num_train_epochs: int = _part("small", 6)
    small_sft_learning_rate: float = _part("small", 1e-3)
    # The same 16 conversations a step in one pass, not four passes of 4: for a model this small a pass costs about
    # the same whatever its batch. SmolLM2's SFT on 400 demonstrations: 0.49 s a step against 1.61, the same loss
    # (0.103), greedy 0.771 against 0.764 on 200 eval days; from 1,200, 0.785 (the greedy rule: 0.773); from 2,000,
    # 0.800 and, through the notebooks, 0.824 (the rule: 0.769; docs/benchmarks.md)
    small_sft_per_device_train_batch_size: int = _part("small", 16)
    small_sft_gradient_accumulation_steps: int = _part("small", 1)
    # GRPO from that warm start ("24gb", 200 eval days, 40 steps): at the recipe's 2e-5 the sampled eval went 0.37 ->
    # 0.48 by step 20 and the greedy one 0.764 -> 0.772; at 1e-4, 0.37 -> 0.65 and greedy 0.780; at 5e-4 it
    # collapsed to 0 by step 13. From 400 demonstrations, 1e-4 took the greedy eval 0.756 -> 0.863; from 2,000,
    # 0.824 -> 0.831, the sampled one 0.684 -> 0.801 (docs/benchmarks.md)
    small_learning_rate: float = _part("small", 1e-4)
    # Its sampling and schedule, from a warm start of 2,000 demonstrations (0.819 greedy), four runs side by side:
    # greedy after 40 steps 0.816 at 1.1 with the cosine schedule, 0.836 at 0.7, 0.845 at 0.7 with a constant 1e-4,
    # 0.835 at a constant 2e-4; through the notebooks, 0.791 -> 0.832 at 0.7 constant ("16bit" from 400 demonstrations:
    # 0.749 -> 0.868). A warm start that plays near its greedy best learns from samples near it
    small_temperature: float = _part("small", 0.7)
    small_lr_scheduler_type: str = _part("small", "constant")
    # GRPOConfig's and SFTConfig's
    lr_scheduler_type: str = _part("trainer", "cosine")
    optim: str = _part("trainer", "adamw_torch")  # Unsloth's default: adamw_8bit. The same AdamW as TRL's fused one
    weight_decay: float = _part("trainer", 0.0)  # Unsloth's: 0.001
    seed: int = _part("trainer", 0)  # LoRA's too. Unsloth's: 3407

    @property
    def on_cpu(self) -> bool:
        """Whether the preset is made for a CPU rather than a GPU."""
        return self.gpu_gb is None


PRESETS = {preset.name: preset for preset in (
    Preset("24gb"),
    Preset("16bit", gpu_gb=48.0, gpu_need_gb=40.0, gpu_need_gb_quantized=40.0,  # the L40S; vLLM takes half
           gpu_need_gb_without_vllm=25.0,
           load_in_4bit=False, vllm_share_16bit=0.5, vllm_weights="16bit", generation_parts_without_vllm=1),
    Preset("16gb", gpu_gb=15.0,  # a T4's usable 15 GB; its bf16 is emulated, so "auto" trains it in fp16
           gpu_need_gb=14.0, gpu_need_gb_quantized=12.0, gpu_need_gb_without_vllm=10.0,
           gradient_accumulation_steps=2,  # 16 rollouts a step: 2 tasks, 8 rollouts each
           per_device_eval_batch_size=16,
           sft_per_device_train_batch_size=2, sft_gradient_accumulation_steps=8),
    Preset("cpu-tiny", gpu_gb=None, gpu_need_gb=0.0, gpu_need_gb_quantized=0.0, gpu_need_gb_without_vllm=0.0,
           torch_threads=1,  # its small CPU host also runs the envs and their server, which more threads spin against
           load_in_4bit=False, max_seq_length=1024, dtype="float32", vllm=False,
           gradient_checkpointing=False,
           full_finetuning_sft=True,  # LoRA over a random model's frozen embeddings can't teach it a tool call
           max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,  # 2 x 4
           generation_parts_without_vllm=1,
           max_completion_length=512,  # the whole GridSim conversation: two tool calls, their prices, and end_turn
           # cooler and slower than the recipe: the tiny warm start's groups keep a spread, and GRPO doesn't undo it
           temperature=0.8, learning_rate=3e-4, warmup_steps=0, eval_steps=None, per_device_eval_batch_size=4,
           precision="fp32",
           # 400 conversations, two a step: the expert's 16 demonstrations 25 times over (a CPU's cost is per
           # conversation, batched or not); enough for the tool calls and a valid 24-hour schedule
           sft_max_steps=200, sft_per_device_train_batch_size=2, sft_gradient_accumulation_steps=1,
           sft_learning_rate=3e-3, sft_warmup_steps=0, sft_max_length=1024, small_model_below=None),
)}


_EXPLICIT = {"report_to": "none", "logging_steps": 1}  # defaults Unsloth's config rewrite replaces, set back
# FastLanguageModel.from_pretrained's precision arguments for vLLM's weights (vllm_weights)
_LOADED_IN = {"fp8": {"load_in_4bit": False, "load_in_fp8": True}, "16bit": {"load_in_4bit": False},
              "4bit": {"load_in_4bit": True}}


AUTO = "auto"  # the preset that fits this host's card


def named(preset: Preset | str) -> Preset:
    """The preset ``preset`` names, or ``preset`` itself; "auto" is the one that fits this host's card, said in one
    line (once); a name not in PRESETS is refused, saying which are."""
    if isinstance(preset, Preset):
        return preset
    if preset == AUTO:
        from agentenv_nb.host.plan import say_plan

        return PRESETS[say_plan().preset]
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {(AUTO, *PRESETS)}, or pass a Preset")
    return PRESETS[preset]


def training_precision(preset: Preset | str, host=None) -> str:
    """The precision ``preset`` trains in: its own, else AGENTENV_NB_PRECISION, else the card's (``host.plan``) of
    ``host`` (a ``host.probe.Host``; None: this machine)."""
    from agentenv_nb.host.plan import plan_here, precision_for

    preset = named(preset)
    if preset.precision != AUTO:
        return preset.precision
    return settings.get("precision") or precision_for(host or plan_here().host)


def table(preset: Preset | str, config=None, model=None):
    """Every setting of ``preset`` by part, as a pandas DataFrame; with a GRPOConfig built from it (``grpo_config``),
    also what that config holds of each GRPO setting (enums by value): the run's own arguments, such as
    ``max_steps``, show there; with the model ``loading.load_model`` loaded, what it was loaded as (``load_in_4bit``,
    ``vllm``), which the card's choice of vLLM's weights decides."""
    import pandas as pd

    preset = named(preset)
    rows = sorted(([field.metadata["part"], field.name, getattr(preset, field.name)]
                   for field in dataclasses.fields(preset) if "part" in field.metadata),
                  key=lambda row: PARTS.index(row[0]))
    held = {} if config is None else {row[1]: getattr(config, row[1], "") for row in rows
                                      if row[0] in ("grpo", "trainer")}
    if model is not None:
        from agentenv_nb.train.rollout import generator

        held.update(load_in_4bit=any(type(module).__name__ == "Linear4bit" for module in model.modules()),
                    vllm=generator(model) == "vllm")
    columns = ["part", "setting", "preset"]
    if config is not None or model is not None:
        columns.append("config")
        for row in rows:
            value = held.get(row[1], "")
            row.append(value.value if isinstance(value, enum.Enum) else value)
    # the preset's name in the header row's corner, above the settings: an index name would get a header row of its own
    return pd.DataFrame(rows, columns=columns).set_index("setting").rename_axis(index=None, columns=preset.name)


def differences(a: Preset | str, b: Preset | str) -> dict[str, tuple]:
    """The settings two presets set differently: {setting: (a's, b's)}."""
    a, b = named(a), named(b)
    return {field.name: (getattr(a, field.name), getattr(b, field.name)) for field in dataclasses.fields(a)
            if field.name != "name" and getattr(a, field.name) != getattr(b, field.name)}


@functools.cache
def _vllm_generates() -> bool:
    """Whether Unsloth's vLLM runs here (``host.plan.engine_for``); says once why not."""
    from agentenv_nb.host.plan import engine_for, plan_here

    ok, why = engine_for(plan_here().host, vllm_available)
    if not ok:
        print(f"agentenv_nb: fast_inference=False ({why}); generating with transformers' generate instead.")
    return ok


def fast_inference(preset: Preset | str) -> bool:
    """Whether a preset generates on Unsloth's colocated vLLM: where it asks to and vLLM imports."""
    return named(preset).vllm and _vllm_generates()


def gpu_need_gb(preset: Preset | str, weights: str | None = None, vllm: bool | None = None) -> float:
    """The free GPU memory ``preset``'s GRPO run needs here: less where it generates without vLLM (``vllm``; None:
    where it does here), or from 4-bit or fp8 ``weights`` (None: those ``named_weights`` names, else 16-bit's)."""
    preset = named(preset)
    if not (fast_inference(preset) if vllm is None else vllm):
        return preset.gpu_need_gb_without_vllm
    quantized = (weights or named_weights(preset)) in ("4bit", "fp8")
    return preset.gpu_need_gb_quantized if quantized else preset.gpu_need_gb


def torch_threads(preset: Preset | str) -> int | None:
    """Torch's CPU threads for a preset, or None for torch's default."""
    return named(preset).torch_threads


def full_finetuning(preset: Preset | str, stage: str) -> bool:
    """Whether ``stage`` ("sft" or "grpo") trains every weight rather than LoRA."""
    return stage == "sft" and named(preset).full_finetuning_sft


@functools.cache
def _say(line: str) -> None:
    print(line)


def named_weights(preset: Preset | str) -> str | None:
    """The precision of vLLM's weights named for ``preset``: its own, else AGENTENV_NB_VLLM_WEIGHTS; None where the
    card chooses ("auto", ``vllm_weights``)."""
    preset = named(preset)
    if preset.vllm_weights not in ("auto", *vllm_sizing.WEIGHTS):
        raise ValueError(f"vllm_weights={preset.vllm_weights!r}: choose 'auto' or one of {vllm_sizing.WEIGHTS}")
    return preset.vllm_weights if preset.vllm_weights != "auto" else settings.get("vllm_weights")


def vllm_weights(preset: Preset | str, model_name: str) -> str:
    """The precision vLLM generates ``model_name`` in for ``preset`` (one of ``vllm_sizing.WEIGHTS``): the one named
    (``named_weights``), else the fastest that fits this card, said in one line (once)."""
    preset = named(preset)
    if named_here := named_weights(preset):
        return named_here
    import torch

    card = vllm_sizing.gpu_memory()[0]
    rollouts = preset.per_device_train_batch_size * preset.gradient_accumulation_steps  # generated at once
    choice, why = vllm_sizing.choose_weights(
        torch.cuda.get_device_capability(vllm_sizing.this_gpu()), card * _vllm_utilization(preset, "16bit"),
        vllm_sizing.weights_16bit_bytes(model_name),
        vllm_sizing.kv_cache_bytes(model_name, rollouts * preset.max_completion_length))
    _say(f"agentenv_nb: vLLM generates from {why}. Name another with AGENTENV_NB_VLLM_WEIGHTS or "
         f"dataclasses.replace(preset, vllm_weights=...), one of {vllm_sizing.WEIGHTS}.")
    return choice


def _vllm_utilization(preset: Preset, weights: str) -> float:
    """vLLM's ``gpu_memory_utilization`` for ``preset`` with weights in ``weights``: its share of the memory the run
    may use."""
    share = preset.vllm_share_16bit if weights == "16bit" else preset.vllm_share
    return vllm_sizing.gpu_memory_utilization(share, *vllm_sizing.gpu_memory(), made_for_bytes=preset.gpu_gb * 1e9)


def model_kwargs(preset: Preset | str, model_name: str, **overrides: Any) -> dict:
    """Keyword arguments for ``FastLanguageModel.from_pretrained``; with vLLM, sized to the memory the run may use,
    its weights in the precision ``vllm_weights`` says."""
    preset = named(preset)
    # An overriding fast_inference (the SFT stage's False) decides first: no vLLM sized, or asked about, for nothing
    use_vllm = overrides.pop("fast_inference") if "fast_inference" in overrides else fast_inference(preset)
    kwargs = {"model_name": model_name, "max_seq_length": preset.max_seq_length, "load_in_4bit": preset.load_in_4bit,
              "fast_inference": use_vllm, "max_lora_rank": preset.lora_r}
    if use_vllm:
        weights = vllm_weights(preset, model_name)
        kwargs.update(_LOADED_IN[weights])
        if "gpu_memory_utilization" not in overrides:  # a share of the WHOLE card
            kwargs["gpu_memory_utilization"] = _vllm_utilization(preset, weights)
    dtype = preset.dtype or {"fp16": "float16"}.get(training_precision(preset))  # else Unsloth's: bf16 from 8.0
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


def _shared(preset: Preset) -> dict:
    """What GRPO and SFT both take from a preset."""
    precision = training_precision(preset)
    return {**_EXPLICIT, **_named_as(preset, "trainer"), "bf16": precision == "bf16", "fp16": precision == "fp16"}


def _small(preset: Preset, model_parameters: float | None) -> bool:
    """Whether a model of ``model_parameters`` gets ``preset``'s settings for a small model."""
    below = preset.small_model_below
    return bool(below) and model_parameters is not None and model_parameters < below


def _grpo_for_size(preset: Preset, model_parameters: float | None) -> dict:
    """GRPO's settings over the preset's for a model of ``model_parameters``: a small model's ``small_*``."""
    if not _small(preset, model_parameters):
        return {}
    return {"learning_rate": preset.small_learning_rate, "temperature": preset.small_temperature,
            "lr_scheduler_type": preset.small_lr_scheduler_type}


def grpo_temperature(preset: Preset | str, model_parameters: float | None = None) -> float:
    """The temperature GRPO samples a model of ``model_parameters`` at: a small model's ``small_temperature``."""
    preset = named(preset)
    return _grpo_for_size(preset, model_parameters).get("temperature", preset.temperature)


def grpo_kwargs(preset: Preset | str, output_dir: str = "outputs", max_steps: int | None = None,
                save_steps: int | None = None, resume: bool | str = False, model_name: str | None = None,
                **overrides: Any) -> dict:
    """The GRPOConfig arguments of a preset; ``resume=True`` picks the last checkpoint in ``output_dir``; a
    ``model_name`` of fewer than ``small_model_below`` parameters (counted from its config) gets the preset's
    ``small_learning_rate``, ``small_temperature`` and ``small_lr_scheduler_type``."""
    preset = named(preset)
    use_vllm = fast_inference(preset)
    kwargs = _named_as(preset, "grpo")
    parts, thinking = kwargs.pop("generation_parts_without_vllm"), kwargs.pop("enable_thinking")
    kwargs = {
        **kwargs, **_shared(preset),
        "chat_template_kwargs": {"enable_thinking": thinking},
        # TRL's group scaling. Unsloth's rewrite turns "group"/True off for dr_grpo; only None keeps it
        # (and becomes "group"). Stock TRL rejects None at the first step, so it gets "group" itself.
        "scale_rewards": None if configs.unsloth_rewrites() else "group",
        "use_vllm": use_vllm,
        "eval_strategy": "steps",
        "eval_on_start": True,
    }
    if use_vllm:
        kwargs["vllm_mode"] = "colocate"  # Unsloth's vLLM shares the model's weights in this process
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    if model_name is not None:
        kwargs.update(_grpo_for_size(preset, vllm_sizing.parameter_count(model_name)))
    if kwargs["eval_steps"] is None:
        kwargs["eval_steps"] = kwargs["max_steps"]  # evaluate at the start and at the end
    kwargs = {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}
    if not use_vllm and parts > 1 and "steps_per_generation" not in overrides:
        kwargs["steps_per_generation"] = max(1, kwargs["gradient_accumulation_steps"] // parts)
    return kwargs


def sft_kwargs(preset: Preset | str, output_dir: str = "sft-outputs", max_steps: int | None = None,
               save_steps: int | None = None, resume: bool | str = False, model_parameters: int | None = None,
               **overrides: Any) -> dict:
    """The SFTConfig arguments of a preset's warm start: assistant-only loss on chats with tool calls; a model of
    fewer than ``small_model_below`` parameters (``model_parameters``) gets the preset's ``small_sft_*``."""
    preset = named(preset)
    kwargs = {
        **_named_as(preset, "sft", prefix="sft_"), **_shared(preset),
        "assistant_only_loss": True,  # learn the model's turns (tool calls, answers), not prompts or tool results
        "loss_type": "nll",  # Unsloth's SFT default too; TRL's is chunked_nll
        "packing": False,
        "padding_free": False,
        "eval_strategy": "no",
    }
    if _small(preset, model_parameters):
        kwargs.update(num_train_epochs=preset.small_sft_num_train_epochs, learning_rate=preset.small_sft_learning_rate,
                      per_device_train_batch_size=preset.small_sft_per_device_train_batch_size,
                      gradient_accumulation_steps=preset.small_sft_gradient_accumulation_steps)
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    return {**kwargs, **_checkpointing(output_dir, save_steps, resume), **overrides}


def async_grpo_kwargs(preset: Preset | str, output_dir: str = "outputs", max_steps: int | None = None,
                      save_steps: int | None = None, resume: bool | str = False, model_name: str | None = None,
                      **overrides: Any) -> dict:
    """The AsyncGRPOConfig arguments of a preset (``train.grpo.trainer.async_grpo_trainer``): its GRPO settings that TRL's
    AsyncGRPOTrainer takes. That trainer has a loss of its own (each token's clipped ratio over the step's tokens:
    no loss_type, scale_rewards or beta, which the recipe sets to 0), generates ahead (``max_staleness``) instead of
    ``steps_per_generation``, and has no eval loop. Its step trains on the preset's rollouts, a micro-batch of
    ``per_device_train_batch_size`` each (``token_budget=0``): TRL's default packs rows of vLLM's ``max_model_len``
    tokens instead, 8 rollouts a step, not 32, on the Qwen3-4B shape (docs/benchmarks.md). Rollouts in flight, each
    an env session: a step's."""
    import_unsloth()  # before trl
    from trl.experimental.async_grpo import AsyncGRPOConfig

    kwargs = grpo_kwargs(preset, output_dir, max_steps, save_steps, resume, model_name)
    taken = {field.name for field in dataclasses.fields(AsyncGRPOConfig)}
    kwargs = {name: value for name, value in kwargs.items() if name in taken}
    kwargs = {**kwargs, "eval_strategy": "no", "eval_on_start": False, "token_budget": 0, **overrides}
    kwargs.setdefault("max_inflight_tasks",
                      kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"])
    return kwargs


def async_grpo_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.experimental.async_grpo.AsyncGRPOConfig`` for ``preset`` (arguments as
    ``async_grpo_kwargs``); imports unsloth first."""
    return configs.build("AsyncGRPOConfig", async_grpo_kwargs(preset, **kwargs))


def trainer_config(trainer: str, preset: Preset | str, **kwargs: Any):
    """The checked config of ``trainer`` (one of ``run.TRAINERS``: "grpo", ``grpo_config``; "async",
    ``async_grpo_config``) for ``preset``; ``train.grpo.trainer.trainer_for`` makes the trainer it configures."""
    from agentenv_nb.train.grpo.run import TRAINERS

    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; choose one of {TRAINERS}")
    return (async_grpo_config if trainer == "async" else grpo_config)(preset, **kwargs)


def grpo_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.GRPOConfig`` for ``preset`` (arguments as ``grpo_kwargs``); imports unsloth first."""
    return configs.build("GRPOConfig", grpo_kwargs(preset, **kwargs))


def sft_config(preset: Preset | str, **kwargs: Any):
    """A checked ``trl.SFTConfig`` for ``preset`` (arguments as ``sft_kwargs``); imports unsloth first."""
    return configs.build("SFTConfig", sft_kwargs(preset, **kwargs))
