"""The trainer settings: the presets as data (``recipes``: ``Preset``, ``PRESETS``, ``table``), what a preset becomes
on this machine and for this model (``choices``: vLLM or not, its weights, the memory needed, a small model or not),
and the arguments built from both for Unsloth's loader, PEFT and TRL's configs (``arguments``; ``configs`` builds
and checks those configs); ``vllm_sizing`` sizes vLLM's share of the card and the precision of its weights, which
``choices`` decides from. This package is their one entry::

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

from agentenv_nb.train.presets.arguments import (async_grpo_config, async_grpo_kwargs, grpo_config, grpo_kwargs,
                                                 grpo_temperature, model_kwargs, peft_kwargs, sft_config, sft_kwargs,
                                                 trainer_config, TRAINERS)
from agentenv_nb.train.presets.choices import (fast_inference, full_finetuning, gpu_need_gb, pretrained, size_problem,
                                               small_model, table, torch_threads, training_precision,
                                               vllm_weights)
from agentenv_nb.train.presets.recipes import AUTO, PARTS, PRESETS, Preset, differences, named

__all__ = ["AUTO", "PARTS", "PRESETS", "Preset", "async_grpo_config", "async_grpo_kwargs", "differences",
           "fast_inference", "full_finetuning", "gpu_need_gb", "grpo_config", "grpo_kwargs", "grpo_temperature",
           "model_kwargs", "named", "peft_kwargs", "pretrained", "sft_config", "sft_kwargs", "size_problem",
           "small_model", "table", "torch_threads", "trainer_config", "TRAINERS", "training_precision", "vllm_weights"]
