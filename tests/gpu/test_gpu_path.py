"""The GPU path, on a CUDA GPU only: the random Qwen3-4B-shaped model loaded in 4-bit through Unsloth
(``loading.load_model(path, "24gb")``), held to an L4's 24 GB, and one GRPO step through ``AgentEnv.local`` (GridSim,
process sandbox) whose rollouts call the env's tools on the server, then an eval whose rollout is filed as the eval's.
Skipped, without importing torch, where there is no NVIDIA driver, and where torch sees no CUDA GPU.

    pytest tests/gpu -o addopts=    # on a GPU machine without nbval; AGENTENV_NB_GPU_MODEL: a model already built
                                    # (bench/gpu_session.sh runs tests/gpu on the GPU machine)

The 4B shape rather than a small model: it is what the notebooks load on a 24 GB GPU, and on an H200 building it
takes about 10 s, loading it in 4-bit about 10 s. A random model writes no tool call of its own, so each assistant
turn is steered into a ``get_prices`` call: two tool rounds a rollout (``max_tool_calling_iterations``). Where vLLM
imports, the preset generates on Unsloth's colocated vLLM (``fast_inference=True``, sized to the 24 GB) and a regex
of vLLM's structured outputs steers; else transformers' ``generate`` and its ``sequence_bias`` do.
"""

import dataclasses
import functools
import os
import shutil
import threading

import pytest


def _cuda() -> bool:
    if not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl")):
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (the 4-bit GPU path): run `pytest tests/gpu` "
                                                     "on a GPU machine (bench/gpu_session.sh)")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from agentenv_nb.stack import import_unsloth

    import_unsloth()  # before transformers and TRL load, so Unsloth patches them
    from agentenv_nb.train.model.tiny import build_random_qwen3_4b

    return os.environ.get("AGENTENV_NB_GPU_MODEL") or build_random_qwen3_4b(
        tmp_path_factory.mktemp("qwen3-4b-random") / "model", device="cuda")


GET_PRICES = '<tool_call>\n{"name": "get_prices", "arguments": {}}\n</tool_call>'


def steer_to_get_prices(tokenizer) -> list:
    """transformers' ``sequence_bias`` (its list form) making every assistant turn ``<tool_call>`` get_prices: each
    token of the call is biased right after the generation prompt's assistant header and the call's tokens before
    it, and the turn ends with ``<|im_end|>``."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         enable_thinking=False, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    header = ids[len(ids) - 1 - ids[::-1].index(tokenizer.convert_tokens_to_ids("<|im_start|>")):]
    call = tokenizer.encode(GET_PRICES + "<|im_end|>", add_special_tokens=False)
    return [[header + call[:i + 1], 100.0] for i in range(len(call))]


def steering(tokenizer, use_vllm: bool) -> dict:
    """GRPO settings that make every assistant turn the ``get_prices`` call, for the backend that generates."""
    if use_vllm:  # vLLM takes no sequence_bias; its structured outputs hold each completion to the call
        return {"vllm_structured_outputs_regex": GET_PRICES.replace("{", r"\{").replace("}", r"\}")}
    return {"generation_kwargs": {"sequence_bias": steer_to_get_prices(tokenizer)}}


def test_4bit_grpo_step_calls_tools_through_agentenv(model_path, tmp_path):
    import torch

    from agentenv_nb import AgentEnv
    from agentenv_nb.notebook.preflight import check_gpu
    from agentenv_nb.notebook.transcript import logged_rollouts
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.grpo.trainer import GRPOTrainer
    from agentenv_nb.tasks.gridsim import write_bundle

    torch.cuda.set_per_process_memory_fraction(min(1.0, 24e9 / torch.cuda.mem_get_info()[1]))  # an L4's 24 GB
    bundle = write_bundle(tmp_path / "gridsim", train=4, eval=1)
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=16) as env:
        four_bit = dataclasses.replace(presets.PRESETS["24gb"], vllm_weights="4bit")  # not the card's fastest
        model, tokenizer = loading.load_model(model_path, four_bit)
        assert any(type(module).__name__ == "Linear4bit" for module in model.modules()), "not loaded in 4-bit"
        [gpu] = check_gpu(four_bit)  # notebook 03's second preflight: what the loaded model holds isn't missing
        assert gpu["status"] == "ok" and "this process holding" in gpu["detail"], gpu
        assert presets.table(four_bit, model=model).loc["load_in_4bit", "config"], "the table misses the 4-bit load"
        use_vllm = presets.fast_inference(presets.PRESETS["24gb"])
        assert (getattr(model, "vllm_engine", None) is not None) == use_vllm, "fast_inference didn't pick the backend"
        config = presets.grpo_config(
            "24gb", output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=8,
            gradient_accumulation_steps=1, max_completion_length=256, eval_strategy="steps", eval_steps=1,
            eval_on_start=False, per_device_eval_batch_size=1, num_generations_eval=1, **steering(tokenizer, use_vllm))
        callers = []

        class Recorded(env.factory):  # the threads the tools run on: the kit's rounds, in Unsloth's compiled trainer
            @functools.wraps(env.factory.get_prices)
            def get_prices(self, **arguments):
                callers.append(threading.current_thread().name)
                return super().get_prices(**arguments)

        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                              eval_dataset=env.dataset_for("eval"), environment_factory=Recorded,
                              reward_funcs=env.reward_funcs, callbacks=[env.metrics])
        trainer.train()

    logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert trainer.state.global_step == 1 and len(logs) == 1
    assert logs[0]["tools/call_frequency"] > 0, "no tool call ran through the env"
    assert logs[0]["tools/failure_frequency"] == 0
    assert callers and all(name.startswith("agentenv_nb-tools") for name in callers), (
        f"tool calls ran outside agentenv_nb.train.grpo.trainer's rounds (threads {sorted(set(callers))}): Unsloth's "
        "trainer no longer calls _tool_call_loop with the batch's _sync_tool_dicts")
    assert logs[0][f"scores/{env.name}/unscored"] == 0, "an episode ended unscored"
    # Unsloth's trainer puts the model back in training mode after it generates, the eval's batches too: its rollout
    # is still the eval's, not the step's
    [evaluated] = [log for log in trainer.state.log_history if "eval_reward" in log]
    assert f"eval_scores/{env.name}/unscored" in evaluated, "the eval's scores were filed as a training step's"
    assert len(logged_rollouts(tmp_path / "grpo", step=1)[1]) == 8, "the step's rollouts file holds others too"
    assert torch.cuda.max_memory_reserved() <= 24e9
    if use_vllm:  # vLLM sized to the 24 GB, not to half of the card
        assert presets.model_kwargs("24gb", model_path)["gpu_memory_utilization"] * torch.cuda.mem_get_info()[1] <= 12e9
