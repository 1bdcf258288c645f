"""The presets as data: one frozen ``Preset`` a hardware target, in one table, ``PRESETS``, that a user lists
(``choices.table``), compares (``differences``) and copies with changes (``dataclasses.replace``).

``"24gb"`` is the Unsloth GridSim recipe (https://www.agentenvframework.com/docs/training/unsloth) on a 24 GB GPU, and
``Preset``'s defaults are its settings; ``"16bit"`` is the same in 16-bit LoRA on a 48 GB card (an L40S), ``"16gb"``
the same on a 16 GB card (a T4 on Colab or Kaggle, in fp16, 16 rollouts a step), ``"cpu-tiny"`` the same shrunk for
the tiny offline model on a CPU (only: on a GPU, Unsloth turns bf16 autocast on for the float32 tiny model).
``"auto"`` is the one that fits this host's card (``host.plan``). The runs behind the figures: docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Where a setting goes; "small": what a small model gets instead, "trainer": GRPO's and SFT's
PARTS = ("machine", "model", "lora", "grpo", "sft", "small", "pretrained", "trainer")


def _part(name: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"part": name})


@dataclasses.dataclass(frozen=True)
class Preset:
    """Every setting a preset decides, with the recipe's on a 24 GB GPU as the defaults. A field named as a TRL,
    Unsloth or PEFT argument is that argument; ``sft_*`` are SFTConfig's of the same name without the prefix;
    ``small_*`` replace them for a model of fewer than ``small_model_below`` parameters (``choices.small_model``)."""

    name: str
    # The machine it is made for
    gpu_gb: float | None = _part("machine", 24.0)  # the card's GB; vLLM's share is taken of at most this. None: a CPU
    gpu_need_gb: float = _part("machine", 21.0)  # free GPU memory the GRPO run needs with vLLM's 16-bit weights
    gpu_need_gb_quantized: float = _part("machine", 17.0)  # the same with vLLM's 4-bit or fp8 weights
    gpu_need_gb_without_vllm: float = _part("machine", 13.0)  # the same generating with transformers' generate
    torch_threads: int | None = _part("machine", None)  # torch's CPU threads; None: torch's default
    largest_model: float | None = _part("machine", None)  # parameters: a larger model is refused, in one line, as
    # more than the machine trains in reasonable time; None: any
    precision: str = _part("machine", "auto")  # "bf16", "fp16", "fp32", or "auto": AGENTENV_NB_PRECISION, else the
    # card's (bf16 from compute capability 8.0, else fp16)
    # FastLanguageModel.from_pretrained
    load_in_4bit: bool = _part("model", True)  # QLoRA on 4-bit weights, where vLLM's weights don't decide
    max_seq_length: int = _part("model", 4096)  # the longest sequence the model is loaded for
    dtype: str | None = _part("model", None)  # a torch dtype's name; None: Unsloth's (its GPU loader takes no names)
    vllm: bool = _part("model", True)  # fast_inference: generate on Unsloth's colocated vLLM where vLLM loads here
    vllm_share: float = _part("model", 0.5)  # vLLM's share of the memory the run may use, with 4-bit or fp8 weights
    vllm_share_16bit: float = _part("model", 0.69)  # the same with 16-bit weights: room for a step's KV cache too
    vllm_weights: str = _part("model", "auto")  # the weights vLLM generates from and LoRA trains on: "16bit", "fp8",
    # "4bit", or "auto": AGENTENV_NB_VLLM_WEIGHTS, else the fastest that fits the card (``choices.vllm_weights``)
    # FastLanguageModel.get_peft_model
    lora_r: int = _part("lora", 32)  # LoRA's rank: larger learns more, slower
    lora_alpha: int = _part("lora", 64)  # LoRA's scale: its updates are multiplied by lora_alpha / lora_r
    lora_targets: tuple[str, ...] = _part("lora", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"))  # every linear layer
    gradient_checkpointing: str | bool = _part("lora", "unsloth")  # recompute activations: less memory, some time
    full_finetuning_sft: bool = _part("lora", False)  # the SFT warm start trains every weight instead of LoRA
    # GRPOConfig
    max_steps: int = _part("grpo", 40)  # optimizer steps of a run
    per_device_train_batch_size: int = _part("grpo", 8)  # rollouts a micro-batch
    gradient_accumulation_steps: int = _part("grpo", 4)  # micro-batches a step: 32 rollouts, 4 tasks of 8
    num_generations: int = _part("grpo", 8)  # rollouts of each task, compared with each other
    generation_parts_without_vllm: int = _part("grpo", 2)  # without vLLM, a step's rollouts generated in this many
    # parts (less KV cache at once); each optimizer step still takes all of them, from one policy
    max_completion_length: int = _part("grpo", 1024)  # the whole conversation's tokens: tool calls and results too
    max_tool_calling_iterations: int = _part("grpo", 2)  # tool-call turns a rollout may take
    enable_thinking: bool = _part("grpo", False)  # the chat template's thinking; on, it may fill the budget first
    temperature: float = _part("grpo", 1.1)  # sampling temperature of the rollouts
    learning_rate: float = _part("grpo", 2e-5)  # Unsloth's default: 5e-5
    warmup_steps: int = _part("grpo", 3)  # Unsloth's default: 10% of the steps
    loss_type: str = _part("grpo", "dr_grpo")  # Dr. GRPO: no length or std normalization of the advantage
    beta: float = _part("grpo", 0.0)  # the KL penalty's weight; 0: no reference model held
    epsilon_high: float = _part("grpo", 0.28)  # the upper clip of the ratio (DAPO's clip-higher)
    eval_steps: int | None = _part("grpo", 20)  # evaluate every this many steps; None: at the start and the end only
    per_device_eval_batch_size: int = _part("grpo", 32)  # eval tasks played at once; Unsloth's default: 4
    num_generations_eval: int = _part("grpo", 1)  # rollouts of each eval task
    # SFTConfig: assistant-only loss on chats with tool calls
    sft_max_steps: int = _part("sft", -1)  # -1: sft_num_train_epochs
    sft_num_train_epochs: int = _part("sft", 1)  # passes over the demonstrations
    sft_per_device_train_batch_size: int = _part("sft", 4)  # conversations a micro-batch
    sft_gradient_accumulation_steps: int = _part("sft", 4)  # micro-batches a step
    sft_per_device_eval_batch_size: int = _part("sft", 8)  # conversations evaluated at once
    sft_learning_rate: float = _part("sft", 1e-4)
    sft_warmup_steps: int = _part("sft", 5)
    sft_max_length: int = _part("sft", 4096)  # longer conversations are cut
    # A small model's SFT warm start and GRPO, in place of the settings above (docs/benchmarks.md has the runs)
    small_model_below: float | None = _part("small", 1e9)  # parameters; None: every model gets the settings above
    small_sft_num_train_epochs: int = _part("small", 6)  # a small model needs more passes to learn the tool calls
    small_sft_learning_rate: float = _part("small", 1e-3)
    small_sft_per_device_train_batch_size: int = _part("small", 16)  # a step's 16 conversations in one pass
    small_sft_gradient_accumulation_steps: int = _part("small", 1)
    small_learning_rate: float = _part("small", 1e-4)  # GRPO's from that warm start
    small_temperature: float = _part("small", 0.7)  # cooler: a warm start near its greedy best learns from samples
    # near it
    small_lr_scheduler_type: str = _part("small", "constant")
    # A pretrained model's SFT warm start on a preset made for the tiny random model (``choices.pretrained``): LoRA,
    # not a full fine-tune, in fewer and gentler steps
    pretrained_from: float | None = _part("pretrained", None)  # parameters; None: every model gets the settings above
    pretrained_sft_max_steps: int = _part("pretrained", 12)  # -1: sft_num_train_epochs
    pretrained_sft_learning_rate: float = _part("pretrained", 1e-3)  # as a small model's on a GPU (small_sft_*)
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
           largest_model=1e9,
           load_in_4bit=False, max_seq_length=1024, dtype="float32", vllm=False,
           gradient_checkpointing=False,
           full_finetuning_sft=True,  # LoRA over a random model's frozen embeddings can't teach it a tool call
           max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,  # 2 x 4
           generation_parts_without_vllm=1,
           max_completion_length=512,  # the whole GridSim conversation: two tool calls, their prices, and end_turn
           # cooler than the recipe: the tiny warm start's groups keep a spread; a small model's learning rate: 3e-4
           # undid the warm start on some CPUs (bench/results/tiny_demo_scores_2026-12-06.json)
           temperature=0.8, learning_rate=1e-4, warmup_steps=0, eval_steps=None, per_device_eval_batch_size=4,
           precision="fp32",
           # 200 steps of two conversations: the expert's 16 demonstrations 25 times over, as a CPU's cost is per
           # conversation, batched or not
           sft_max_steps=200, sft_per_device_train_batch_size=2, sft_gradient_accumulation_steps=1,
           sft_learning_rate=3e-3, sft_warmup_steps=0, sft_max_length=1024, small_model_below=None,
           pretrained_from=1e7),  # the tiny model has under a million parameters; SmolLM2-135M, Gemma 3 270M are real
)}

RECIPE = PRESETS["24gb"]  # the recipe page's own settings, which the others change
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


def differences(a: Preset | str, b: Preset | str) -> dict[str, tuple]:
    """The settings two presets set differently: {setting: (a's, b's)}."""
    a, b = named(a), named(b)
    return {field.name: (getattr(a, field.name), getattr(b, field.name)) for field in dataclasses.fields(a)
            if field.name != "name" and getattr(a, field.name) != getattr(b, field.name)}
