"""Which engine ``play`` generates on, chosen in one place (``rollout.generator``): a model Unsloth loaded with its
colocated vLLM (``fast_inference=True``, which gives it a ``vllm_engine``) plays there, from its current LoRA weights;
any other with transformers' ``generate``. Both cut a reply at the same tokens. vLLM needs a CUDA GPU:
tests/gpu/test_vllm_play.py plays the same tasks on both engines there and compares them."""

from agentenv_nb.stack import import_unsloth


def test_the_model_picks_the_engine_and_both_stop_at_the_same_tokens(tmp_path):
    import_unsloth()
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.rollout import generator, stop_ids

    model, tokenizer = loading.load_model("tiny", "cpu-tiny", models_dir=tmp_path, corpus=["a tiny corpus"])
    assert generator(model) == "transformers"  # the CPU preset loads no vLLM
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    assert stop_ids(model, tokenizer) == {tokenizer.pad_token_id, tokenizer.eos_token_id,
                                          tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    model.vllm_engine = None  # what Unsloth's loader leaves without an engine
    assert generator(model) == "transformers"


def test_vllm_play_hands_vllm_the_lora_as_the_pinned_unsloth_grpo_does():
    """``rollout._on_vllm`` calls what Unsloth sets on a fast_inference PEFT model: ``fast_generate`` (the engine's
    ``generate``) and ``load_lora(folder, load_tensors=True)``, the live adapter's tensors as a LoRA request, as
    Unsloth's GRPOTrainer calls it before each generation. Read from the pinned sources (vLLM, which they import,
    needs a GPU); a change there fails here."""
    import importlib.util
    from pathlib import Path

    import_unsloth()  # unsloth_zoo refuses to import before unsloth

    def source(module: str) -> str:  # found from its top package: importing unsloth.models would patch TRL's
        top, *rest = module.split(".")  # trainers for this process's other tests
        folder = Path(importlib.util.find_spec(top).origin).parent
        return folder.joinpath(*rest[:-1], rest[-1] + ".py").read_text()

    assert "def load_lora(model, save_directory, load_tensors = False, lora_request_id = None):" in source(
        "unsloth_zoo.vllm_utils")
    peft = source("unsloth.models._utils")
    assert "model.load_lora = functools.partial(load_lora, model)" in peft
    assert "model.fast_generate = model.model.fast_generate" in peft
    assert "lora_request = self.model.load_lora('" in source("unsloth.models.rl")
    assert "model.fast_generate = model.vllm_engine.generate" in source("unsloth.models.llama")
