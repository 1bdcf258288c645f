"""A server's tool, as a method TRL offers the model: a name, typed keyword parameters and a Google-style docstring
made from the tool's JSON schema, so ``transformers.utils.get_json_schema`` (TRL 1.15's schema reader) gives the
model the server's schema back.

    method = tool_method({"name": "submit", "description": "Submit a schedule.", "input_schema": {
        "type": "object", "properties": {"hours": {"type": "array", "items": {"type": "integer"}}},
        "required": ["hours"]}}, call=lambda self, name, arguments: ...)
    # def submit(self, *, hours: list[int]), whose docstring's Args: describe hours;
    # calling it runs call(self, "submit", {"hours": [...]})
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Callable
from typing import Any, Literal, Union

RESERVED = ("reset", "get_reward")  # TRL's own methods of an environment: never tools

_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def tool_method(tool: dict[str, Any], call: Callable[[Any, str, dict[str, Any]], Any]):
    """A function ``(self, **arguments) -> call(self, name, arguments)`` whose signature and docstring describe
    ``tool``. Parameters whose names aren't Python identifiers can't be described; ``checks`` reports them."""
    name = tool["name"]
    schema = tool.get("input_schema") or tool.get("inputSchema") or {}
    properties, required = schema.get("properties") or {}, set(schema.get("required") or ())
    parameters, described = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], []
    for parameter, spec in properties.items():
        if not parameter.isidentifier() or keyword.iskeyword(parameter):
            continue
        default = inspect.Parameter.empty if parameter in required else spec.get("default")
        parameters.append(inspect.Parameter(parameter, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=python_type(spec)))
        described.append(f"    {parameter}: {_line(spec.get('description')) or f'The {parameter} argument.'}")

    signature = inspect.Signature(parameters)
    takes = ", ".join(p.name + (" (required)" if p.default is p.empty else "") for p in parameters[1:]) or "nothing"

    def method(self, **arguments):
        # TRL hands the model what a tool raises: an argument the tool lacks is said to it, not sent to the server.
        if unknown := [repr(given) for given in arguments if given not in signature.parameters or given == "self"]:
            raise TypeError(f"{name} has no argument {', '.join(unknown)}; it takes {takes}")
        try:
            signature.bind(self, **arguments)
        except TypeError as e:
            raise TypeError(f"{name}: {e}; it takes {takes}") from None
        return call(self, name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature
    method.__annotations__ = {p.name: p.annotation for p in parameters[1:]}
    method.__doc__ = (tool.get("description") or f"The {name} tool.").strip() + (
        "\n\nArgs:\n" + "\n".join(described) if described else "")
    return method


def python_type(spec: dict[str, Any]) -> Any:
    """The type hint ``get_json_schema`` turns back into ``spec``'s JSON schema type, as near as hints go: nested
    objects become ``dict``."""
    if isinstance(spec.get("enum"), list) and spec["enum"] and all(
            isinstance(value, str | int | float | bool | None) for value in spec["enum"]):
        return Literal[tuple(spec["enum"])]
    if options := spec.get("anyOf") or spec.get("oneOf"):
        return Union[tuple(python_type(option) for option in options)]  # noqa: UP007 (a runtime union of hints)
    kind = spec.get("type")
    if isinstance(kind, list):
        return Union[tuple(python_type({**spec, "type": each}) for each in kind)]  # noqa: UP007
    if kind == "array":
        return list[python_type(spec["items"])] if isinstance(spec.get("items"), dict) else list
    if kind == "object":
        extra = spec.get("additionalProperties")
        return dict[str, python_type(extra)] if isinstance(extra, dict) else dict
    return _TYPES.get(kind, Any)


def _line(text: str | None) -> str:
    """One line: a Google-style Args: entry ends where the next line starts."""
    return re.sub(r"\s+", " ", text or "").strip()
