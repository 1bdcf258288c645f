"""The SFT set is counted before any trainer is built: each demonstration lost between the demonstrations and TRL's
SFTTrainer (a template that fails, no assistant turn marked, a first reply past ``sft_max_length``) is counted with
its cause, and a set left empty or nearly so stops in one line that names the cause and the setting that fixes it,
where the trainer would fail deep inside with "num_samples=0". With the tiny model's real tokenizer and templates."""

import dataclasses

import pytest
from transformers import AutoTokenizer

from agentenv_nb.stops import Stop
from agentenv_nb.train import presets
from agentenv_nb.train.warm_start.demos import sft_dataset

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def _demonstration(a: int, b: int, padding: str = "") -> dict:
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    return {"messages": [{"role": "user", "content": f"{padding}What is {a} plus {b}?"},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "add", "content": str(a + b)},
                         {"role": "assistant", "content": f"{a + b}."}], "tools": [ADD], "reward": 1.0}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _tokens(tokenizer, demonstration) -> tuple[int, int, int]:
    """Where its first reply begins, where its last ends, and its length, in the tokenizer's tokens."""
    from agentenv_nb.client.checks import masking_template

    mask = tokenizer.apply_chat_template(demonstration["messages"], tools=demonstration["tools"], tokenize=True,
                                         chat_template=masking_template(tokenizer), return_dict=True,
                                         return_assistant_tokens_mask=True)["assistant_masks"]
    return mask.index(1), len(mask) - mask[::-1].index(1), len(mask)


def test_demonstrations_past_the_sft_length_stop_in_one_line_naming_it_and_the_longest(tokenizer, capsys):
    demos = [_demonstration(3, 4), _demonstration(5, 6, padding="Please, "), _demonstration(1, 2)]
    firsts, lasts, lengths = zip(*(_tokens(tokenizer, demo) for demo in demos))
    first, last, longest = min(firsts), max(lasts), max(lengths)
    short = dataclasses.replace(presets.PRESETS["cpu-tiny"], sft_max_length=first)  # every first reply cut away
    with pytest.raises(Stop) as stopped:
        sft_dataset(demos, tokenizer, short)
    assert str(stopped.value) == (
        f"SFT keeps 0 of the 3 demonstrations: 3 whose first reply begins past sft_max_length={first} tokens (the "
        f"longest takes {longest} of this model's tokens): a preset with sft_max_length and max_seq_length of at "
        f"least {longest} (dataclasses.replace)")

    # Cut short, not lost: kept, and said; a length that holds them all says nothing
    cutting = dataclasses.replace(short, sft_max_length=last - 1)
    assert len(sft_dataset(demos, tokenizer, cutting)) == 3
    assert capsys.readouterr().out.startswith("SFT keeps 3 of the 3 demonstrations: 1 cut short, their last reply "
                                              f"ending past sft_max_length={last - 1} tokens")
    assert len(sft_dataset(demos, tokenizer, "cpu-tiny")) == 3 and capsys.readouterr().out == ""


def test_a_few_lost_are_said_and_a_template_that_fails_or_marks_no_reply_stops(tokenizer, capsys):
    demos = [_demonstration(3, 4), _demonstration(5, 6), _demonstration(1, 2, padding="x " * 300)]
    first = _tokens(tokenizer, demos[2])[0]
    preset = dataclasses.replace(presets.PRESETS["cpu-tiny"], sft_max_length=first - 1)
    assert len(sft_dataset(demos, tokenizer, preset)) == 2  # two of three: trained on, and the loss said
    assert capsys.readouterr().out.startswith("SFT keeps 2 of the 3 demonstrations: 1 whose first reply begins past")

    failing = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    failing.chat_template = "{% generation %}{{ raise_exception('tool turns are not supported') }}{% endgeneration %}"
    with pytest.raises(Stop, match=r"^SFT keeps 0 of the 3 demonstrations: 3 the chat template fails on "
                                   r"\(TemplateError: tool turns are not supported\)"):
        sft_dataset(demos, failing, "cpu-tiny")
    unmarked = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    unmarked.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(Stop, match=r"^SFT keeps 0 of the 3 demonstrations: 3 with no assistant turn the template "
                                   r"marks"):
        sft_dataset(demos, unmarked, "cpu-tiny")
