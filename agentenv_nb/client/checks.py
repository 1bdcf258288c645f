"""Checks to run before training, for what TRL 1.15 only finds at its first step, or never: every tool's schema
reads back through TRL's schema reader, the chat template is one TRL parses tool calls for, and ``reset`` takes the
dataset's rows.

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


def template_problems(tokenizer) -> list[str]:
    """Why TRL can't render or parse tool calls with ``tokenizer``'s chat template, if it can't. Imports TRL: in a
    training process, import unsloth first (``agentenv_nb.stack.import_unsloth``)."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    fix = ("TRL 1.15 parses tool calls only for the chat templates it knows by exact string (Qwen3, Qwen3.5, "
           "Llama 3.1/3.2, GPT-OSS, ...): for a Qwen3-format model set tokenizer.chat_template = "
           "trl.chat_template_utils.qwen3_chat_template, or give the tokenizer a response_template")
    if getattr(tokenizer, "chat_template", None) is None:
        return [f"the tokenizer has no chat template; {fix}"]
    problems = []
    if not supports_tool_calling(tokenizer):
        problems.append(f"the tokenizer's chat template can't render a tool-calling conversation; {fix}")
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(copy.copy(tokenizer))  # a copy: the check leaves the tokenizer as it was
        except ValueError:
            problems.append(f"the tokenizer's chat template is not one TRL parses tool calls for; {fix}")
    return problems


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
