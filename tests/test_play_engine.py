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

