"""The environments TRL 1.15's GRPOTrainer plays a bundle's tasks with: ``AgentEnv.factory`` makes a subclass of
``Environment`` per toolset, whose public methods are the tools, and TRL makes one per rollout in flight.

    Play = env.factory                 # class <bundle>(Environment), with a method per tool and end_turn
    play = Play()                      # one session on the server, held from rollout to rollout
    play.reset(**env.dataset[0])       # starts the task in the background; returns None
    play.end_turn(response="42")       # "The episode has ended." (or the next turn's prompt)
    play.get_reward()                  # 1.0, or None when the episode ended in an error, logging why
    with env.factory() as play: ...    # outside a trainer: closes the session, freeing its slot

A tool call that fails raises ToolFailed, whose message TRL hands the model as the tool's result.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .session import Session, SessionError

if TYPE_CHECKING:
    from .client import AgentEnv

logger = logging.getLogger(__name__)

END_TURN = "end_turn"
MAX_TURNS = 64  # empty replies get_reward gives a task still asking, before it gives up on it


class ToolFailed(Exception):
    """A tool call that failed; TRL hands its message to the model as the tool's result."""


@dataclass
class Episode:
    """One rollout's episode, as the environment sees it; ``error`` says why it is left unscored."""

    split: str
    index: int
    task_id: str | None
    started: Future | None = None
    finished: Future | None = None
    done: bool = False
    reward: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    reply: str | None = None


class Environment:
    """Base of the classes ``AgentEnv.factory`` makes, one per toolset and named after the bundle: their public
    methods are the tools (``tools.tool_method``), so this class has none but ``reset`` and ``get_reward``."""

    _agent: AgentEnv
    _tools: tuple[dict[str, Any], ...]

    def __init__(self):
        self._session = Session(self._agent.next_url(), **self._agent.timeouts)
        self._episode: Episode | None = None
        self._agent._environments.append(self)

    def reset(self, split: str, index: int, task_id: str | None = None, **row: Any) -> None:
        """Start task ``index`` of ``split`` on this environment's session and return at once: the row's prompt is
        the task's first turn. The first reset opens the session, raising when the server has no room for it."""
        if not self._session.opened:
            self._agent.run(self._session.open(), self._session.reset_bound, "opening a session")
        self._episode = Episode(split, index, task_id)
        self._episode.started = self._agent.submit(self._start(self._episode))

    def get_reward(self) -> float | None:
        """The episode's reward once every turn has ended, or None, logging why, when it ended in an error."""
        episode = self._episode
        if episode is None:
            return None
        if self._agent.plain_text_replies and episode.reply is None:
            self._agent.warn_once("plain_text_replies is on, but the trainer handed no completion to this "
                                  "environment: pass reward_funcs=env.reward_funcs to GRPOTrainer")
        self._agent._finish_episodes()
        bound = self._session.reset_bound + MAX_TURNS * self._session.call_timeout
        try:
            self._agent.wait(episode.finished, bound, "ending the episode")
        except SessionError as e:
            episode.error = episode.error or str(e)
        reward = None if episode.error else self._reward(episode)
        if self._agent._metrics is not None:
            self._agent._metrics.record(type(self).__name__, None if reward is None else episode.scores)
        if reward is None:
            logger.warning("rollout left unscored: %s", episode.error)
        return reward

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc) -> None:
        """Close the session, for an environment played outside a trainer: it would hold its slot till the end."""
        self._agent._environments.remove(self)
        self._agent.run(self._session.close(), 2 * self._session.patience, "closing a session")

    def _reward(self, episode: Episode) -> float | None:
        rule = self._agent.reward
        try:
            if rule is None:
                reward = episode.reward
            elif callable(rule):
                reward = rule(episode.scores)
            else:
                reward = episode.scores[rule]
        except Exception as e:  # a reward= that can't score this task's scores
            episode.error = f"reward= can't score {episode.scores}: {type(e).__name__}: {e}"
            return None
        if reward is None:
            episode.error = f"the task recorded no reward (scores: {episode.scores})"
        return reward

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call for TRL, which passes a raised ToolFailed to the model as the tool's result."""
        if self._episode is None:
            raise ToolFailed("no episode: TRL calls reset before any tool")
        bound = self._session.reset_bound + self._session.call_timeout
        return self._agent.run(self._play(self._episode, name, arguments), bound, name)

    def _take_reply(self, reply: str) -> None:
        if self._episode is not None:
            self._episode.reply = reply

    async def _start(self, episode: Episode) -> None:
        try:
            started = await self._session.reset(episode.split, episode.index)
            if not started.get("done") and self._agent.toolsets == "first":
                await self._check_tools(episode)
        except SessionError as e:
            episode.error = f"reset: {e}"
            return
        if started.get("done"):
            episode.error = f"reset: {(started.get('metadata') or {}).get('error')}"

    async def _check_tools(self, episode: Episode) -> None:
        """Warn when the task offers other tools than the first task's, which its class shows the model."""
        listed = (await self._session.step({"type": "list_tools"}))["observation"]["tools"]
        offered, shown = sorted(tool["name"] for tool in listed), sorted(tool["name"] for tool in self._tools)
        if offered != shown:
            self._agent.warn_once(f"task {episode.task_id} offers the tools {offered}, not the first task's {shown} "
                                  "that the model is shown: make the AgentEnv with toolsets='each'")

    async def _play(self, episode: Episode, name: str, arguments: dict[str, Any]) -> str:
        await asyncio.wrap_future(episode.started)
        if episode.error or episode.done:
            raise ToolFailed(f"the episode ended in an error: {episode.error}" if episode.error else
                             "the episode has ended")
        try:
            data = await self._session.step({"type": "call_tool", "tool_name": name, "arguments": arguments})
        except SessionError as e:
            episode.error = f"{name}: {e}"
            raise ToolFailed(episode.error) from None
        observation, metadata = data.get("observation") or {}, data.get("metadata") or {}
        if observation.get("error"):
            raise ToolFailed(observation["error"].get("message"))
        if data.get("done"):
            episode.done, episode.reward, episode.scores = True, data.get("reward"), metadata.get("scores") or {}
            if metadata.get("status") == "error":
                episode.error = f"{name}: {metadata.get('error')}"
                raise ToolFailed(episode.error)
            return "The episode has ended." if name == END_TURN else _text(observation.get("result"))
        result = observation.get("result")
        return result["prompt"] if name == END_TURN else _text(result)

    async def _finish(self, episode: Episode) -> None:
        """End the turns the model left open: the current one with its plain-text reply, if any, then the rest
        empty."""
        await asyncio.wrap_future(episode.started)
        reply = episode.reply or ""
        for _ in range(MAX_TURNS):
            if episode.error or episode.done:
                return
            try:
                await self._play(episode, END_TURN, {"response": reply})
            except ToolFailed as e:
                episode.error = episode.error or f"{END_TURN}: {e}"
                return
            reply = ""
        episode.error = f"the task still asked for turns after {MAX_TURNS} empty replies"


def _text(result: Any) -> str:
    """A tool result as the model reads it: the server's text, or the result as JSON."""
    if isinstance(result, dict) and isinstance(result.get("data"), str):
        return result["data"]
    return result if isinstance(result, str) else json.dumps(result)
