"""The presets hold the recipe page's recipe, set Unsloth's changed defaults back, and survive the config classes;
a preset is data a user can list, compare and copy with changes.

The configs are built with ``import unsloth`` first, as in the notebooks; on a GPU machine that is
Unsloth's GRPOConfig rewrite, on a CPU stock TRL with Unsloth's CPU patches.
"""

import dataclasses

import pytest

from agentenv_nb.train import presets
from agentenv_nb.train.presets import PRESETS, configs

# The recipe page's train.py, on a 24 GB GPU.
RECIPE = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "num_generations": 8,
    "max_completion_length": 1024, "max_tool_calling_iterations": 2,
    "chat_template_kwargs": {"enable_thinking": False}, "temperature": 1.1, "learning_rate": 2e-5,
    "lr_scheduler_type": "cosine", "warmup_steps": 3, "loss_type": "dr_grpo", "beta": 0.0,
    "epsilon_high": 0.28, "optim": "adamw_torch", "weight_decay": 0.0, "bf16": True, "logging_steps": 1,
    "eval_strategy": "steps", "eval_steps": 20, "eval_on_start": True, "num_generations_eval": 1,
    "per_device_eval_batch_size": 32, "seed": 0, "report_to": "none", "max_steps": 40,
}
# The recipe page's "Settings Unsloth changes": left unset, Unsloth's config would give these other values.
UNSLOTH_CHANGES = ["optim", "weight_decay", "learning_rate", "warmup_steps", "seed",
                   "per_device_eval_batch_size", "scale_rewards"]


def test_24gb_is_the_seed_recipe():
    import torch

    kwargs = presets.grpo_kwargs("24gb")
    assert {name: kwargs[name] for name in RECIPE} == RECIPE
    assert set(UNSLOTH_CHANGES) <= set(kwargs)
    # TRL generates on vLLM exactly where the model was loaded with it; never on a machine without a CUDA GPU
    assert kwargs["use_vllm"] == presets.model_kwargs("24gb", "m")["fast_inference"]
    assert not kwargs["use_vllm"] or torch.cuda.is_available()
    # without vLLM, a step's 32 rollouts are generated 16 at a time (half the KV cache); each update still takes 32
    assert kwargs.get("steps_per_generation") == (None if kwargs["use_vllm"] else 2)
    assert presets.grpo_kwargs("24gb", gradient_accumulation_steps=1).get("steps_per_generation") in (None, 1)
    assert presets.grpo_kwargs("24gb", steps_per_generation=4).get("steps_per_generation") == 4
    assert "steps_per_generation" not in presets.grpo_kwargs("16bit")
    model = presets.model_kwargs("24gb", "qwen3-4b-gridsim-sft")
    assert model["load_in_4bit"] and model["max_seq_length"] == 4096 and model["max_lora_rank"] == 32
    assert not presets.model_kwargs("16bit", "m")["load_in_4bit"]
    lora = presets.peft_kwargs("24gb")
    assert (lora["r"], lora["lora_alpha"], lora["use_gradient_checkpointing"]) == (32, 64, "unsloth")
    assert lora["target_modules"] == list(presets.PRESETS["24gb"].lora_targets)


@pytest.mark.parametrize("preset", presets.PRESETS)
def test_configs_keep_every_setting(preset, tmp_path):
    grpo = presets.grpo_config(preset, output_dir=str(tmp_path))  # raises on any drift
    assert configs.config_drift(grpo, presets.grpo_kwargs(preset, output_dir=str(tmp_path))) == {}
    assert grpo.scale_rewards == "group" and grpo.loss_type == "dr_grpo"  # TRL's scaling, not Unsloth's off
    sft = presets.sft_config(preset, output_dir=str(tmp_path))
    assert sft.assistant_only_loss and sft.weight_decay == 0.0 and sft.seed == 0


def test_drift_is_reported(tmp_path):
    kwargs = presets.grpo_kwargs("cpu-tiny", output_dir=str(tmp_path))
    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path))
    config.scale_rewards, config.weight_decay = "none", 0.001  # what Unsloth's rewrite would have done
    assert configs.config_drift(config, kwargs) == {"scale_rewards": ("group", "none"), "weight_decay": (0.0, 0.001)}
    with pytest.raises(ValueError, match="scale_rewards"):
        configs.check_config(config, kwargs)


def test_the_table_says_what_the_model_was_loaded_as(tmp_path):
    """Notebook 03's table: beside a preset's load_in_4bit and vllm, the model's own (on a GPU, the card's choice of
    vLLM's weights may load 16-bit where the preset's load_in_4bit says True)."""
    from agentenv_nb.train.model import loading

    model, _ = loading.load_model("tiny", "cpu-tiny", models_dir=tmp_path, corpus=["a tiny corpus"])
    shown = presets.table("24gb", model=model)
    assert shown.loc["load_in_4bit"].tolist() == ["model", True, False]
    assert shown.loc["vllm"].tolist() == ["model", True, False] and shown.loc["temperature", "config"] == ""


def test_a_preset_is_data_a_user_lists_compares_and_copies(tmp_path):
    recipe = presets.PRESETS["24gb"]
    listed = presets.table("24gb")
    assert listed.loc["temperature", "preset"] == 1.1 and listed.loc["load_in_4bit", "part"] == "model"
    assert set(listed.index) == {field.name for field in dataclasses.fields(recipe)} - {"name"}
    assert presets.differences("24gb", "16bit") == {  # the L40S row: 16-bit LoRA on a 48 GB card
        "gpu_gb": (24.0, 48.0), "gpu_need_gb": (21.0, 40.0), "gpu_need_gb_quantized": (17.0, 40.0),
        "gpu_need_gb_without_vllm": (13.0, 25.0),
        "load_in_4bit": (True, False), "vllm_share_16bit": (0.69, 0.5), "vllm_weights": ("auto", "16bit"),
        "generation_parts_without_vllm": (2, 1)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.temperature = 0.9
    mine = dataclasses.replace(recipe, name="mine", temperature=0.9, lora_r=16, sft_learning_rate=5e-5)
    assert presets.grpo_kwargs(mine)["temperature"] == 0.9 and presets.grpo_kwargs("24gb")["temperature"] == 1.1
    assert presets.peft_kwargs(mine)["r"] == 16 and presets.model_kwargs(mine, "m")["max_lora_rank"] == 16
    assert presets.sft_kwargs(mine)["learning_rate"] == 5e-5
    config = presets.grpo_config(mine, output_dir=str(tmp_path), max_steps=7)  # a checked config of one's own
    shown = presets.table(mine, config)  # the run's own arguments as the config holds them, enums by value
    assert shown.loc["temperature", "config"] == 0.9 and shown.loc["max_steps"].tolist() == ["grpo", 40, 7]
    assert shown.loc["lr_scheduler_type", "config"] == "cosine"  # not <SchedulerType.COSINE: 'cosine'>
    assert shown.loc["optim", "config"] == config.optim.value  # transformers' own choice of the AdamW kernel


def test_user_arguments(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-12").mkdir()
    kwargs = presets.grpo_kwargs("16bit", output_dir=str(tmp_path), max_steps=12, save_steps=4, resume=True)
    assert (kwargs["max_steps"], kwargs["save_strategy"], kwargs["save_steps"]) == (12, "steps", 4)
    assert kwargs["resume_from_checkpoint"] == str(tmp_path / "checkpoint-12")
    assert presets.grpo_kwargs("16bit", output_dir=str(tmp_path / "new"), resume=True)["resume_from_checkpoint"] is None
    assert presets.grpo_kwargs("cpu-tiny", max_steps=3)["eval_steps"] == 3  # eval at the start and the end
    assert presets.sft_kwargs("cpu-tiny", max_steps=5)["max_steps"] == 5
    with pytest.raises(ValueError, match="unknown preset"):
        presets.grpo_kwargs("80gb")


def test_vllm_is_sized_to_the_memory_a_run_may_use(monkeypatch):
    """vLLM's gpu_memory_utilization is a share of the whole card: the recipe's half is taken of what the run may
    use (a cap, AGENTENV_NB_GPU_MEMORY_GB), at most the preset's own card, then turned into a share of the card."""
    from agentenv_nb import settings
    from agentenv_nb.train.presets.vllm_sizing import gpu_memory_utilization as share

    recipe = presets.PRESETS["24gb"]
    h200, l4, made_for = 150.1e9, 23.6e9, recipe.gpu_gb * 1e9
    assert share(recipe.vllm_share, l4, made_for_bytes=made_for) == 0.5  # the recipe's 0.5 on an L4
    assert share(0.5, h200) == 0.5  # no preset, no cap: half the card, as before
    # the "24gb" preset on an H200: 12 GB, not 75
    assert share(0.5, h200, made_for_bytes=made_for) * h200 == pytest.approx(12e9, rel=1e-3)
    assert share(0.5, h200, allowed_bytes=24e9) * h200 == pytest.approx(12e9, rel=1e-3)  # a 24 GB cap
    assert share(0.5, h200, allowed_bytes=16e9, made_for_bytes=made_for) * h200 == pytest.approx(8e9, rel=1e-3)
    assert share(0.5, l4, allowed_bytes=40e9, made_for_bytes=made_for) == 0.5  # never more than the card
    assert presets.PRESETS["16bit"].gpu_gb == 48.0  # the L40S
    monkeypatch.setenv("AGENTENV_NB_GPU_MEMORY_GB", "24")
    assert settings.get("gpu_memory_gb") == 24.0
    monkeypatch.setenv("AGENTENV_NB_GPU_MEMORY_GB", "0.5")
    with pytest.raises(settings.SettingError, match="AGENTENV_NB_GPU_MEMORY_GB"):
        settings.get("gpu_memory_gb")


def test_a_small_model_gets_the_warm_start_measured_for_it_and_a_large_one_the_recipes(tiny_model):
    large_here = dataclasses.replace(presets.PRESETS["24gb"], small_model_below=1_000)  # the tiny model is large here
    small, large = presets.sft_kwargs("24gb", model=tiny_model), presets.sft_kwargs(large_here, model=tiny_model)
    assert (small["num_train_epochs"], small["learning_rate"]) == (6, 1e-3)
    batch = lambda kwargs: (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"])  # noqa: E731
    assert batch(small) == (16, 1) and batch(large) == (4, 4)  # one pass of the same 16 conversations a step
    assert (large["num_train_epochs"], large["learning_rate"]) == (1, 1e-4) == (
        presets.sft_kwargs("24gb")["num_train_epochs"], presets.sft_kwargs("24gb")["learning_rate"])
    assert presets.sft_kwargs("cpu-tiny", model=tiny_model)["learning_rate"] == 3e-3  # the tiny model's own


def test_grpo_on_a_small_model_gets_its_measured_settings_counted_from_the_model_folder(tiny_model):
    # tiny_model: a random Qwen3-format folder of a few million parameters, counted from its config, nothing loaded
    grpo = lambda kwargs: (kwargs["learning_rate"], kwargs["temperature"], kwargs["lr_scheduler_type"])  # noqa: E731
    assert grpo(presets.grpo_kwargs("24gb", model_name=tiny_model)) == (1e-4, 0.7, "constant")
    assert grpo(presets.grpo_kwargs("24gb")) == (2e-5, 1.1, "cosine")  # the recipe's, for a model not named
    assert presets.grpo_temperature("24gb", tiny_model) == 0.7 and presets.grpo_temperature("24gb") == 1.1
    assert presets.grpo_kwargs("24gb", model_name=tiny_model, learning_rate=3e-5)["learning_rate"] == 3e-5  # --set
    # no small settings there: its own rate, the small model's
    assert presets.grpo_kwargs("cpu-tiny", model_name=tiny_model)["learning_rate"] == presets.PRESETS[
        "cpu-tiny"].learning_rate == presets.PRESETS["24gb"].small_learning_rate
    big = dataclasses.replace(presets.PRESETS["24gb"], small_model_below=1_000)
    assert grpo(presets.grpo_kwargs(big, model_name=tiny_model)) == (2e-5, 1.1, "cosine")


def test_the_sft_of_a_loaded_model_and_the_grpo_of_its_folder_agree_on_whether_it_is_small(tiny_model):
    """Notebook 02 asks of the model it loaded (with LoRA attached), notebook 03 of the folder it loads: the same
    answer at the threshold itself, where LoRA's own weights would tip a count of the loaded model over it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentenv_nb.train.presets import vllm_sizing

    recipe = presets.PRESETS["24gb"]
    loaded = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                            LoraConfig(r=recipe.lora_r, target_modules=list(recipe.lora_targets)))
    counted = vllm_sizing.parameter_count(tiny_model)
    assert loaded.num_parameters() > counted  # what the loaded model counts of itself: LoRA's weights too
    for below, small in ((counted + 1, True), (counted, False)):
        preset = dataclasses.replace(recipe, small_model_below=below)
        assert presets.small_model(preset, loaded) is presets.small_model(preset, tiny_model) is small
        assert (presets.sft_kwargs(preset, model=loaded)["learning_rate"] == preset.small_sft_learning_rate) is small
        assert (presets.grpo_kwargs(preset, model_name=tiny_model)["learning_rate"]
                == preset.small_learning_rate) is small
        assert (presets.grpo_temperature(preset, loaded) == preset.small_temperature) is small


def _config_folder(path, model_type: str, **shape) -> str:
    """A model folder holding only a config of ``shape``: what the presets decide from, nothing loaded."""
    from transformers import AutoConfig

    AutoConfig.for_model(model_type, **shape).save_pretrained(path)
    return str(path)


GEMMA3_270M = {"vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256}
"""Gemma 3 270M's shape (its GGUF file's): 268M parameters, 170M of them its embeddings."""
QWEN3_4B = {"vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True}


def test_a_pretrained_model_on_the_cpu_preset_gets_lora_and_minutes_not_the_tiny_models_full_fine_tune(
        tiny_model, tmp_path):
    gemma = _config_folder(tmp_path / "gemma", "gemma3_text", **GEMMA3_270M)
    assert presets.full_finetuning(PRESETS["cpu-tiny"], "sft", tiny_model)  # the random model: every weight
    assert not presets.full_finetuning(PRESETS["cpu-tiny"], "sft", gemma)
    assert not presets.full_finetuning(PRESETS["cpu-tiny"], "grpo")
    tiny, real = presets.sft_kwargs("cpu-tiny", model=tiny_model), presets.sft_kwargs("cpu-tiny", model=gemma)
    assert (tiny["max_steps"], tiny["learning_rate"]) == (200, 3e-3)
    recipe = presets.PRESETS["cpu-tiny"]
    assert (real["max_steps"], real["learning_rate"]) == (recipe.pretrained_sft_max_steps,
                                                          recipe.pretrained_sft_learning_rate) == (12, 1e-3)
    assert presets.sft_kwargs("cpu-tiny", model=gemma, max_steps=5)["max_steps"] == 5  # the notebook's own count
    assert not presets.pretrained(PRESETS["24gb"], gemma)  # a GPU preset's settings are made for real models already
    assert presets.table("cpu-tiny").loc["pretrained_from", "preset"] == 1e7


def test_a_model_too_large_to_train_on_a_cpu_is_refused_in_one_line(tmp_path):
    qwen = _config_folder(tmp_path / "qwen", "qwen3", **QWEN3_4B)
    gemma = _config_folder(tmp_path / "gemma", "gemma3_text", **GEMMA3_270M)
    assert presets.size_problem(PRESETS["cpu-tiny"], gemma) is None
    assert presets.size_problem(PRESETS["24gb"], qwen) is None
    problem = presets.size_problem(PRESETS["cpu-tiny"], qwen)
    assert problem.startswith("the model has 4.0B parameters, more than the 'cpu-tiny' preset trains on this machine")
    assert "'16gb' on Colab's T4" in problem and "\n" not in problem


def test_a_family_whose_vllm_refuses_float16_trains_in_fp32_where_the_card_has_no_bf16(tmp_path, monkeypatch,
                                                                                        capsys):
    """On a T4 (AGENTENV_NB_PRECISION=fp16 stands in for its reading) Gemma 3 trains and generates in fp32, which
    the loader, the trainers' flags, the preset table and one line say; another family keeps fp16, and a card with
    bf16 keeps bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    gemma = _config_folder(tmp_path / "gemma", "gemma3_text", **GEMMA3_270M)
    qwen = _config_folder(tmp_path / "qwen", "qwen3", **QWEN3_4B)
    monkeypatch.setenv("AGENTENV_NB_PRECISION", "fp16")
    assert presets.training_precision(PRESETS["16gb"], model=qwen) == "fp16"
    assert presets.training_precision(PRESETS["16gb"], model=gemma) == "fp32"
    assert "trains in fp32, not fp16: vLLM refuses float16 for gemma3_text models" in capsys.readouterr().out
    assert presets.model_kwargs("16gb", gemma)["dtype"] is torch.float32
    assert presets.model_kwargs("16gb", qwen)["dtype"] is torch.float16
    for kwargs in (presets.sft_kwargs("16gb", model=gemma), presets.grpo_kwargs("16gb", model_name=gemma)):
        assert (kwargs["bf16"], kwargs["fp16"]) == (False, False)
    with torch.device("meta"):
        loaded = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(gemma))
    assert presets.table("16gb", model=loaded).loc["precision", "config"] == "fp32"
    monkeypatch.setenv("AGENTENV_NB_PRECISION", "bf16")
    assert presets.training_precision(PRESETS["16gb"], model=gemma) == "bf16"


def test_an_sft_micro_batch_holds_what_its_logits_leave_room_for():
    """Gemma 3 270M's SFT ran out of memory on a 24 GB card beside vLLM: 16 conversations of about 906 tokens a
    micro-batch, float32 logits over 262,144 tokens (15.2 GB; "Tried to allocate 14.17 GiB", 9.2 GB free). Its
    micro-batch shrinks, keeping a step's 16 conversations; SmolLM2's (49,152 tokens) and a CPU's stay."""
    from agentenv_nb.train.presets.choices import sft_micro_batch

    free = 24e9 - 13.75 * 2**30
    batch, accumulation, line = sft_micro_batch(16, 1, 906, 262_144, free)
    assert (batch, accumulation) == (4, 4) and batch * 906 * 262_144 * 4 <= free / 2
    assert "16 conversations of up to 906 tokens a micro-batch make 15.2 GB of logits" in line
    assert "4 a micro-batch (3.8 GB) and 4 micro-batches a step, the same 16 conversations a step" in line
    assert sft_micro_batch(16, 1, 906, 49_152, free) == (16, 1, "")
    assert sft_micro_batch(16, 1, 906, 262_144, None) == (16, 1, "")
    batch, accumulation, line = sft_micro_batch(4, 4, 16_000, 262_144, free)  # one conversation is too much
    assert (batch, accumulation) == (1, 16) and "lower sft_max_length" in line
