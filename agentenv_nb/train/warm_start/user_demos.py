"""A warm start for a bundle without an expert: demonstrations a user gives, a JSONL of conversations in the chat
format TRL's SFTTrainer takes, checked against the bundle's tools before any training.

    demos = read_demonstrations("demos.jsonl", env.factories)   # raises naming the line and what to fix
    trainer = SFTTrainer(..., train_dataset=sft_dataset(demos))  # train.warm_start.demos.sft_dataset

A line is ``{"messages": [...]}``, optionally with ``"tools"``: system, user, assistant and tool messages; an
assistant message's ``tool_calls`` are ``{"type": "function", "function": {"name": ..., "arguments": {...}}}``, as
TRL's docs write them. Every call must name a tool of one toolset of the bundle, with arguments that tool takes and
all it requires; the conversation is given that toolset's tools, as the trainer will show them to the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentenv_nb.client.tools import RESERVED
from agentenv_nb.stops import Stop
from agentenv_nb.train.rollout import Rollout

ROLES = ("system", "user", "assistant", "tool")


class DemonstrationError(Stop, ValueError):
    """A demonstrations file that can't be learned from as it is; the message names the line and the fix."""


def toolset_schemas(factories: dict[str, type]) -> dict[str, list[dict]]:
    """Each toolset's tools as TRL shows them to the model (``transformers``' ``get_json_schema`` of each
    environment method), by toolset."""
    import inspect

    from transformers.utils import get_json_schema

    return {name: [get_json_schema(function.__get__(cls)) for tool, function in
                   inspect.getmembers(cls, inspect.isfunction) if not tool.startswith("_") and tool not in RESERVED]
            for name, cls in factories.items()}


def read_demonstrations(path: str | Path, factories: dict[str, type]) -> list[Rollout]:
    """The conversations of the JSONL at ``path``, each checked against the tools of ``factories`` (an
    ``AgentEnv``'s, one class a toolset) and given its toolset's tools; raises DemonstrationError naming the first
    line that doesn't fit and why."""
    path = Path(path)
    if not path.is_file():
        where = "" if path.is_absolute() else f" in {Path.cwd()}"  # a notebook's working folder is notebooks/
        raise DemonstrationError(f"no demonstrations file {path}{where}: give its absolute path, or write one "
                                 'conversation a line as JSON ({"messages": [...]}), or set DEMOS="" to warm-start '
                                 "another way")
    toolsets = toolset_schemas(factories)
    demos = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            demos.append(_demonstration(json.loads(line), toolsets))
        except (json.JSONDecodeError, DemonstrationError, TypeError, KeyError, AttributeError) as e:
            raise DemonstrationError(f"{path} line {number}: {e}") from None
    if not demos:
        raise DemonstrationError(f"{path} holds no conversation: write one a line as JSON ({{\"messages\": [...]}})")
    return demos


def _demonstration(row: dict[str, Any], toolsets: dict[str, list[dict]]) -> Rollout:
    messages = row["messages"]
    if not isinstance(messages, list) or not any(m.get("role") == "assistant" for m in messages):
        raise DemonstrationError("no assistant message: a demonstration shows what the model should say")
    if bad := [m.get("role") for m in messages if m.get("role") not in ROLES]:
        raise DemonstrationError(f"role {bad[0]!r}: roles are {', '.join(ROLES)}")
    calls = [call["function"] for m in messages if m["role"] == "assistant" for call in m.get("tool_calls") or []]
    toolset, problem = None, "no toolset"
    for name, tools in toolsets.items():  # the first toolset every call fits
        problem = _misfit(calls, {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools})
        if problem is None:
            toolset = name
            break
    if toolset is None:
        offered = "; ".join(f"{name}: {', '.join(t['function']['name'] for t in tools)}"
                            for name, tools in toolsets.items())
        raise DemonstrationError(f"{problem}; the bundle's tools are {offered}")
    if "tools" in row and sorted(t["function"]["name"] for t in row["tools"]) != \
            sorted(t["function"]["name"] for t in toolsets[toolset]):
        raise DemonstrationError("its tools aren't the bundle's: leave \"tools\" out, and the bundle's are used")
    return Rollout(task_id=row.get("task_id", ""), messages=messages, tools=toolsets[toolset], reward=None,
                   tool_calls=len(calls), tool_failures=0)


def _misfit(calls: list[dict], tools: dict[str, dict]) -> str | None:
    """Why ``calls`` don't fit ``tools`` (name to parameter schema), or None."""
    for call in calls:
        name, arguments = call["name"], call.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if name not in tools:
            return f"it calls {name!r}, which no toolset offers"
        properties, required = tools[name].get("properties", {}), set(tools[name].get("required", []))
        if unknown := sorted(set(arguments) - set(properties)):
            return f"{name} has no argument {', '.join(map(repr, unknown))}"
        if missing := sorted(required - set(arguments)):
            return f"{name} needs {', '.join(map(repr, missing))}"
    return None
