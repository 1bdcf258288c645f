"""A model TRL parses no tool calls for gets a tool-calling template built from its own turns, and the round trip
(render, tokenize, mask for SFT, parse back with TRL's parser) passes for it and fails, one line each, for broken
templates. Tokenizers of four families: Llama 3's header format, Gemma 3's turns, Mistral's [INST], a base model."""

import copy

import pytest

from agentenv_nb.client.checks import template_problems
from agentenv_nb.train.model.tiny import build_tokenizer
from agentenv_nb.train.model.tool_template import use_tool_template

END_OF_TURN = {"llama3": "<|eot_id|>", "gemma": "<end_of_turn>", "mistral": "</s>", "base": "<|endoftext|>"}


@pytest.fixture(scope="module")
def tokenizers():
    return {family: build_tokenizer(family=family, vocab_size=700) for family in [*END_OF_TURN, "qwen3"]}


@pytest.mark.parametrize("family", END_OF_TURN)
def test_a_model_trl_does_not_know_gets_a_template_whose_round_trip_passes(family, tokenizers, tmp_path, capsys):
    from transformers import AutoTokenizer

    tokenizer = copy.deepcopy(tokenizers[family])
    [before] = template_problems(tokenizer)
    assert "use_tool_template(tokenizer) builds one from the model's own turns" in before
    use_tool_template(tokenizer)
    [said] = capsys.readouterr().out.splitlines()
    assert f"ending turns with {END_OF_TURN[family]}" in said
    assert ("no chat template" in said) == (family == "base")
    assert tokenizer.eos_token == END_OF_TURN[family]  # generation stops where a turn ends
    assert template_problems(tokenizer) == []

    tokenizer.save_pretrained(tmp_path)  # the template and its parser travel with the model
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert template_problems(again) == []
    use_tool_template(again)
    assert capsys.readouterr().out == "" and again.chat_template == tokenizer.chat_template


def test_a_template_trl_knows_is_left_as_it_is(tokenizers, capsys):
    tokenizer = copy.deepcopy(tokenizers["qwen3"])
    template = tokenizer.chat_template
    use_tool_template(tokenizer)
    assert tokenizer.chat_template == template and capsys.readouterr().out == ""
    assert template_problems(tokenizer) == []


def test_a_template_that_cannot_be_read_gets_the_plain_format(tokenizers, capsys):
    tokenizer = copy.deepcopy(tokenizers["gemma"])
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    use_tool_template(tokenizer)
    assert "a plain User:/Assistant: format (the chat template ends an assistant turn with ''" in \
        capsys.readouterr().out
    assert tokenizer.eos_token == "<eos>" and template_problems(tokenizer) == []


def test_a_stop_token_of_several_tokens_fails_the_round_trip(tokenizers, capsys):
    tokenizer = copy.deepcopy(tokenizers["gemma"])
    use_tool_template(tokenizer)
    tokenizer.chat_template = tokenizer.chat_template.replace('"<end_of_turn>"', '"<end_turn>"')  # not a token
    [problem] = template_problems(tokenizer)
    assert "an assistant turn ends with" in problem and "not the stop token '<end_of_turn>' generation stops at" \
        in problem and "use_tool_template(tokenizer)" in problem


def test_a_template_that_drops_tool_results_fails_the_round_trip(tokenizers):
    from trl.chat_template_utils import qwen3_template

    tokenizer = copy.deepcopy(tokenizers["qwen3"])
    tokenizer.chat_template = tokenizer.chat_template.replace("{{- content }}\n        {{- '\\n</tool_response>' }}",
                                                              "{{- '\\n</tool_response>' }}")
    tokenizer.response_template = qwen3_template  # the user's own template and parser
    assert template_problems(tokenizer) == [
        "the chat template drops tool results, so the model would never read what its calls return; "
        "agentenv_nb.train.model.tool_template.use_tool_template(tokenizer) builds one from the model's own turns "
        "(load_model does it), or set tokenizer.chat_template and tokenizer.response_template to your own"]


def test_calls_the_parser_does_not_read_back_fail_the_round_trip(tokenizers):
    tokenizer = copy.deepcopy(tokenizers["llama3"])
    use_tool_template(tokenizer)
    tokenizer.chat_template = tokenizer.chat_template.replace('"arguments": ', '"args": ')
    [problem] = template_problems(tokenizer)
    assert problem.startswith("TRL's parser reads the assistant's call add({'a': 3, 'b': 4}) back as ")


def test_a_template_that_drops_tool_calls_fails_the_round_trip(tokenizers):
    from trl.chat_template_utils import llama3_chat_template, qwen3_template

    tokenizer = copy.deepcopy(tokenizers["llama3"])
    tokenizer.chat_template, tokenizer.response_template = llama3_chat_template, qwen3_template  # writes content only
    [problem] = template_problems(tokenizer)
    assert problem.startswith("the chat template drops the assistant's tool calls; ")


def test_a_template_trl_parses_but_cannot_mask_for_sft_gets_one_built_from_its_turns(tokenizers, capsys):
    from trl.chat_template_utils import llama3_2_chat_template

    tokenizer = copy.deepcopy(tokenizers["llama3"])
    tokenizer.chat_template = llama3_2_chat_template  # TRL parses its calls; SFTTrainer has no training version
    [problem] = template_problems(tokenizer)
    assert problem.startswith("the chat template marks no assistant turns ({% generation %}) for SFT's ")
    use_tool_template(tokenizer)
    assert "using one built from its own turns, ending turns with <|eot_id|>" in capsys.readouterr().out
    assert template_problems(tokenizer) == []
