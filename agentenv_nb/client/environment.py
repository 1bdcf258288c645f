"""The environments TRL 1.15's GRPOTrainer plays a bundle's tasks with: ``AgentEnv.factory`` makes a subclass of
``Environment`` per toolset (``environment_class``), whose public methods are the tools, and TRL makes one per
rollout in flight. Each holds a ``Player`` (``client.player``): its session and the episode it plays.

    Play = env.factory                 # class <bundle>(Environment), with a method per tool and end_turn
    play = Play()                      # one session on the server, held from rollout to rollout
    play.reset(**env.dataset[0])       # starts the task in the background; returns None
    play.end_turn(response="42")       # "The episode has ended." (or the next turn's prompt)
    play.get_reward()                  # 1.0, or None when the episode ended in an error, logging why
    with env.factory() as play: ...    # outside a trainer: closes the session, freeing its slot
    pickle.loads(pickle.dumps(env.factory))   # the class again, in any process: TRL's AsyncGRPOTrainer's rollouts

A class pickles as what rebuilds it (its name, the server's tools and the AgentEnv's rules), so TRL 1.15's
AsyncGRPOTrainer can hand it to the process it spawns for rollouts; there it plays on a runtime of that process, and
each ``get_reward`` ends its own episode only (``ScoredAlone``). A ``reward=`` given to AgentEnv must pickle too (a
step id, or a module-level function).

A tool call that fails raises ToolFailed, whose message TRL hands the model as the tool's result. TRL calls
``get_reward()`` with nothing, so a model's plain-text answer reaches the task through a reward function TRL runs
first, ``read_plain_text_replies`` (``AgentEnv.reward_funcs``).
"""

from __future__ import annotations

import asyncio
import copyreg
import json
import threading
from collections.abc import Callable
from typing import Any

from agentenv_nb.client.player import Player, Rules
from agentenv_nb.client.runtime import Runtime
from agentenv_nb.client.tools import RESERVED, tool_method


class Environment:
    """Base of the classes ``environment_class`` makes, one per toolset and named after the bundle: their public
    methods are the tools, so this class has none but ``reset`` and ``get_reward``."""

    _make_player: Callable[[], Player]

    def __init__(self):
        self._player = self._make_player()

    def reset(self, split: str, index: int, task_id: str | None = None, **row: Any) -> None:
        """Start task ``index`` of ``split`` on this environment's session and return at once: the row's prompt is
        the task's first turn. The first reset opens the session, raising when the server has no room for it."""
        self._player.start(split, index, task_id, prompt=row.get("prompt") or [])

    def get_reward(self) -> float | None:
        """The episode's reward once every turn has ended, or None, logging why, when it ended in an error; raises
        before the first ``reset``."""
        return self._player.reward()

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc) -> None:
        """Close the session, for an environment played outside a trainer: it would hold its slot till the end."""
        self._player.close()


class ScoredAlone(Environment):
    """An environment rebuilt from a pickle, in TRL's AsyncGRPOTrainer's rollout process: that trainer scores each
    rollout as it ends, on its event loop, while others still play, so ``get_reward`` ends this episode only, and
    waits for it off that loop."""

    async def get_reward(self) -> float | None:
        """The episode's reward once its turns have ended, or None, logging why, when it ended in an error."""
        return await asyncio.to_thread(self._player.reward, alone=True)


class EnvironmentClass(type):
    """The type of the classes ``environment_class`` makes, which pickle as what rebuilds them (``copyreg``)."""

    _built_from: tuple[str, tuple[dict[str, Any], ...], Rules]


def environment_class(name: str, tools: tuple[dict[str, Any], ...], runtime: Runtime, rules: Rules,
                      base: type[Environment] = Environment) -> type[Environment]:
    """A subclass of ``base`` named ``name`` with a method per tool of ``tools`` (those TRL can offer), playing on
    ``runtime``'s sessions."""
    methods = {tool["name"]: tool_method(tool, _call) for tool in tools
               if not tool["name"].startswith("_") and tool["name"] not in RESERVED}
    return EnvironmentClass(name, (base,), {
        **methods, "_make_player": staticmethod(lambda: Player(runtime, rules, tools, name)), "_tools": tools,
        "_built_from": (name, tools, rules), "__module__": __name__, "__qualname__": name})


_rebuilt: dict[str, type[Environment]] = {}  # by what they were rebuilt from: one class and runtime a process
_rebuilding = threading.Lock()


def rebuilt_class(name: str, tools: tuple[dict[str, Any], ...], rules: Rules) -> type[Environment]:
    """The class a pickled environment class stands for, in the process that unpickles it: its tools, playing the
    same servers on a runtime of this process, scored alone (``ScoredAlone``); one class for each it stands for."""
    key = json.dumps([name, tools, rules.urls, rules.token], sort_keys=True, default=str)
    with _rebuilding:
        if key not in _rebuilt:
            from agentenv_nb.lifecycle import close_at_exit

            runtime = Runtime(name)
            close_at_exit(lambda: runtime.close(rules.timeouts["patience"]))
            _rebuilt[key] = environment_class(name, tools, runtime, rules, base=ScoredAlone)
        return _rebuilt[key]


copyreg.pickle(EnvironmentClass, lambda cls: (rebuilt_class, cls._built_from))


def server_tools(cls: type[Environment]) -> tuple[dict[str, Any], ...]:
    """The tools the server offers an environment class, as it describes them."""
    return cls._tools


def player_of(environment: Any) -> Player | None:
    """The Player behind an environment this module made, or None for any other object."""
    return getattr(environment, "_player", None) if isinstance(environment, Environment) else None


def read_plain_text_replies(completions: list, environments: list | None = None, **_: Any) -> list[None]:
    """Give each environment its completion's last plain-text reply, which ends the turn when the model never
    called ``end_turn``; scores nothing (None), so the environment's own reward stands alone."""
    for completion, environment in zip(completions, environments or (), strict=False):
        player = player_of(environment)
        if player is not None:
            player.take_reply(last_reply(completion))
    return [None] * len(completions)


def last_reply(completion: list[dict[str, Any]] | str) -> str:
    """The text of the completion's last assistant message."""
    if isinstance(completion, str):
        return completion.strip()
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content.strip()
    return ""


def _call(environment: Environment, name: str, arguments: dict[str, Any]) -> str:
    return environment._player.call(name, arguments)
