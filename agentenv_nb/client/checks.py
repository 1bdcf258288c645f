"""Checks to run before training, for what TRL 1.15 only finds at its first step, or never: every tool's schema
reads back through TRL's schema reader, the chat template is one TRL parses tool calls for and a conversation with tool
calls makes the round trip training takes it through (rendered, tokenized, masked for SFT, parsed back), and
``reset`` takes the dataset's rows.

    from agentenv_nb.client.checks import check
    check(env.factories, tokenizer, env.dataset)       # or env.check(tokenizer); raises CheckFailed

Each problem says how to fix it.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from agentenv_nb.client.environment import server_tools
from agentenv_nb.client.tools import RESERVED


FIX = ("agentenv_nb.train.model.tool_template.use_tool_template(tokenizer) builds one from the model's own turns "
       "(load_model does it), or set tokenizer.chat_template and tokenizer.response_template to your own")
"""The fix for a chat template TRL can't train tool calls with."""


class CheckFailed(ValueError):
    """What would keep training from working, a line a problem."""


def check(factories: dict[str, type], tokenizer, dataset=None) -> None:
    """Raise CheckFailed listing every problem found with the environment classes, the tokenizer and the rows."""
    problems = [*tool_problems(factories), *template_problems(tokenizer)]
    if dataset is not None:
        problems += row_problems(factories, dataset)
    if problems:
        raise CheckFailed("AgentEnv can't train as set up:\n- " + "\n- ".join(problems))


def tool_problems(factories: dict[str, type]) -> list[str]:
    """Each server tool the model can't be offered as its server describes it."""
    from transformers.utils import get_json_schema

    problems = []
    for name, cls in factories.items():
        for tool in server_tools(cls):
            where = f"tool {tool['name']!r} of {name!r}"
            method = getattr(cls, tool["name"], None)
            if not inspect.isfunction(method) or tool["name"] in RESERVED:
                problems.append(f"{where} can't be a method TRL offers: TRL keeps reset, get_reward and names "
                                "starting with _ for itself; rename the tool in the env")
                continue
            try:
                schema = get_json_schema(method)["function"]["parameters"]
            except Exception as e:  # transformers raises several kinds for hints and docstrings it can't read
                problems.append(f"{where}: TRL's schema reader (transformers' get_json_schema) fails on it: "
                                f"{type(e).__name__}: {e}; report the tool's JSON schema with this message")
                continue
            wanted = (tool.get("input_schema") or {}).get("properties") or {}
            if lost := sorted(set(wanted) - set(schema["properties"])):
                problems.append(f"{where}: parameters {lost} aren't Python names, so TRL can't offer them; rename "
                                "them in the env's tool")
            required = set((tool.get("input_schema") or {}).get("required") or ()) - set(lost)
            if required != set(schema.get("required") or ()):
                problems.append(f"{where}: TRL would offer it with required parameters "
                                f"{sorted(schema.get('required') or ())}, not {sorted(required)}; report this")
    return problems


FIX = ("agentenv_nb.train.model.tool_template.use_tool_template(tokenizer) builds one from the model's own turns "
       "(load_model does it), or set tokenizer.chat_template and tokenizer.response_template to your own")
"""The fix for a chat template TRL can't train tool calls with."""


def template_problems(tokenizer, round_trip: bool = True) -> list[str]:
    """Why TRL can't render, parse or mask for SFT the tool calls of ``tokenizer``'s chat template, if it can't; with
    ``round_trip``, what ``round_trip_problems`` finds in place of TRL's own checks. Imports TRL: in a
    training process, import unsloth first (``agentenv_nb.stack.import_unsloth``)."""
    from trl.chat_template_utils import supports_tool_calling

    if getattr(tokenizer, "chat_template", None) is None:
        return [f"the tokenizer has no chat template; {FIX}"]
    if (problems := _parser_problems(tokenizer)) or round_trip:
        return problems or round_trip_problems(tokenizer)
    if not supports_tool_calling(tokenizer):
        problems.append(f"the tokenizer's chat template can't render a tool-calling conversation; {FIX}")
    try:
        masking_template(tokenizer)
    except ValueError as error:
        problems.append(f"{error}; {FIX}")
    return problems


def masking_template(tokenizer) -> str | None:
    """The template SFTTrainer masks the assistant's tokens with (None: the tokenizer's own), as it picks it."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    try:
        return None if has_generation_markers(tokenizer.chat_template) else get_training_chat_template(tokenizer)
    except ValueError:
        raise ValueError("the chat template marks no assistant turns ({% generation %}) for SFT's assistant-only "
                         "loss, and TRL has no training version of it") from None


def _parser_problems(tokenizer) -> list[str]:
    """Why TRL has no parser for the tool calls ``tokenizer`` writes, if it hasn't."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(copy.copy(tokenizer))  # a copy: the check leaves the tokenizer as it was
        except ValueError:
            return ["TRL 1.15 parses tool calls only for the chat templates it knows by exact string (Qwen3, "
                    f"Qwen3.5, Llama 3.1/3.2, GPT-OSS, ...), and this one is none of them; {FIX}"]
    return []


def _call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(name: str, **kinds: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": {
        "type": "object", "properties": {key: {"type": kind} for key, kind in kinds.items()}, "required": list(kinds)}}}


_QUESTION, _RESULT = "What is 3 plus 4, and the weather where I am?", "RESULT_7_q8z"
ROUND_TRIP = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": _QUESTION},
    {"role": "assistant", "content": "", "tool_calls": [_call("add", {"a": 3, "b": 4})]},
    {"role": "tool", "name": "add", "content": _RESULT},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Paris", "days": [1, 2]})]},
]
"""The conversation the round trip renders: a tool call, its result, and a second call."""
_ROUND_TRIP_TOOLS = [_tool("add", a="integer", b="integer"), _tool("get_weather", city="string", days="array")]


def round_trip_problems(tokenizer) -> list[str]:
    """What breaks when ``ROUND_TRIP`` goes through ``tokenizer`` as training takes it: rendered with its tools and
    tokenized, the assistant turns parsed back with TRL's parser must give back the same calls, each must end with
    the single stop token generation stops at, and SFT's assistant-only loss mask must cover those turns only."""
    from trl.chat_template_utils import add_response_schema, parse_response

    try:
        text = tokenizer.apply_chat_template(ROUND_TRIP, tools=_ROUND_TRIP_TOOLS, tokenize=False)
    except Exception as e:  # jinja2's TemplateError for roles a template refuses, TypeError, KeyError, ...
        return [f"the chat template fails on a conversation with tool calls and a tool result "
                f"({type(e).__name__}: {e}); {FIX}"]
    if _RESULT not in text:
        return [f"the chat template drops tool results, so the model would never read what its calls return; {FIX}"]
    if "Paris" not in text:  # an argument of the second call: the tools' descriptions name the tools themselves
        return [f"the chat template drops the assistant's tool calls; {FIX}"]
    try:
        masking = masking_template(tokenizer)
    except ValueError as error:
        return [f"{error}; {FIX}"]
    rendered = tokenizer.apply_chat_template(ROUND_TRIP, tools=_ROUND_TRIP_TOOLS, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True, chat_template=masking)
    ids, spans = rendered["input_ids"], _runs(rendered["assistant_masks"])
    replies = [message for message in ROUND_TRIP if message["role"] == "assistant"]
    if len(spans) != len(replies):
        return [f"SFT's assistant-only loss mask covers {len(spans)} stretch(es) of the conversation, not its "
                f"{len(replies)} assistant turns; mark each assistant turn, its end-of-turn token included, with "
                "{% generation %}...{% endgeneration %}, or " + FIX]
    if parsing := _parser_problems(tokenizer):
        return parsing
    parser = tokenizer if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None) \
        else add_response_schema(copy.copy(tokenizer))
    eos, problems = tokenizer.eos_token, {}  # a line a kind of problem, the first turn's that shows it
    if eos is None or tokenizer.encode(eos, add_special_tokens=False) != [tokenizer.eos_token_id]:
        problems["stop"] = (f"the stop token {eos!r} (the tokenizer's EOS) is not one token, so generation can't "
                            f"stop on it; make the EOS the single token that ends an assistant turn, or {FIX}")
    for (start, end), reply in zip(spans, replies):
        turn = ids[start:end]
        if any(text in tokenizer.decode(turn) for text in (_QUESTION, _RESULT)):
            problems.setdefault("mask", "SFT's assistant-only loss mask covers the user's or a tool's text as well "
                                "as the assistant's, so the model would learn to write them; mark only assistant "
                                "turns with {% generation %}...{% endgeneration %}, or " + FIX)
        wanted = [(c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]]
        got = [(c["function"]["name"], c["function"]["arguments"])
               for c in parse_response(parser, turn, prefix=ids[:start]).get("tool_calls") or []]
        if got != wanted:
            problems.setdefault("calls", f"TRL's parser reads the assistant's call {wanted[0][0]}({wanted[0][1]}) "
                                f"back as {got or 'no call'}, so a rollout's calls wouldn't run; {FIX}")
        if [token for token in turn if tokenizer.decode([token]).strip()][-1:] != [tokenizer.eos_token_id]:
            problems.setdefault("stop", f"an assistant turn ends with {tokenizer.decode(turn[-3:])!r}, not the stop "
                                f"token {eos!r} generation stops at, so generation would run past its turns; end "
                                f"each assistant turn with the tokenizer's EOS (a single token), or {FIX}")
    return list(problems.values())


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The (start, end) of each stretch of 1s in ``mask``."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def row_problems(factories: dict[str, type], dataset) -> list[str]:
    """Why TRL's ``reset(**row)`` can't take the dataset's rows, or can't route them to an environment."""
    columns = set(dataset.column_names)
    if missing := sorted({"prompt", "split", "index"} - columns):
        return [f"the dataset has no {missing} column(s): train on AgentEnv.dataset (or dataset_for), changing "
                "the prompt if you like, and keep its split and index columns"]
    problems = []
    routed = set(dataset["environment"]) if "environment" in columns else set()
    if len(factories) > 1:
        if unknown := sorted(routed - set(factories)):
            problems.append(f"rows route to environments {unknown} the factory lacks; it has {sorted(factories)}: "
                            "pass environment_factory the merged factories of every AgentEnv whose rows you mix")
        if not routed:
            problems.append("the factory is a dict, so TRL routes rows by their environment column, which the "
                            "dataset lacks: keep the column AgentEnv.dataset gives")
    row: dict[str, Any] = {key: value for key, value in dataset[0].items() if key != "environment"}
    for name, cls in factories.items():
        try:
            inspect.signature(cls.reset).bind(None, **row)
        except TypeError as e:
            problems.append(f"{name}.reset can't take the dataset's rows ({e}); keep the split and index columns")
    return problems
