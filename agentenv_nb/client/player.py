"""One rollout's episode played on one session: the ``Player`` behind each environment TRL plays. It runs on the
runtime's event loop; an environment's ``reset``, tool calls and ``get_reward`` are its ``start``, ``call`` and
``reward``.

    player = Player(runtime, rules, tools, "gridsim")   # one session on the next server of ``rules``
    player.start("train", 0, task_id)                   # the task starts in the background
    player.call("get_prices", {})                        # waits for the start, then plays the tool call
    player.reward()                                      # ends the open turns, then the episode's reward or None

Players may be played from many threads at once, each episode by one thread: ``reward()`` ends the open turns of the
episodes its thread started (TRL resets a batch, plays it, then reads the rewards from one thread, so a batch's turns
end at once), and returns its own episode's reward whatever other threads do. A tool call that fails raises
ToolFailed, whose message TRL hands the model as the tool's result.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from agentenv_nb.client.runtime import Runtime
from agentenv_nb.client.session import CapacityError, Session, SessionError
from agentenv_nb.envs.app import Reward

logger = logging.getLogger(__name__)

END_TURN = "end_turn"
MAX_TURNS = 64  # empty replies get_reward gives a task still asking, before it gives up on it


class ToolFailed(Exception):
    """A tool call that failed; TRL hands its message to the model as the tool's result."""


@dataclass(frozen=True)
class Rules:
    """How an AgentEnv's environments play: the servers' sessions, the reward rule, and the options. They pickle
    (with a ``reward`` that does), for environments rebuilt in another process."""

    urls: tuple[str, ...]  # the servers, each new session on the next with room
    timeouts: dict[str, float]
    reward: Reward = None
    plain_text_replies: bool = False
    toolsets: Literal["first", "each"] = "first"
    token: str | None = None  # the servers' access token
    turns: itertools.count = field(default_factory=itertools.count, init=False, repr=False, compare=False)

    def urls_in_turn(self) -> list[str]:
        """The servers in the order the next session tries them: the next in turn first, then the others."""
        first = next(self.turns) % len(self.urls)
        return [*self.urls[first:], *self.urls[:first]]

    def __reduce__(self):
        return Rules, tuple(getattr(self, f.name) for f in fields(self) if f.init)  # the turns start again there


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
    messages: list[dict] = field(default_factory=list)  # the prompt, each tool call and its result, the reply


class Player:
    """One session and the episode it plays, on the runtime's event loop: what an ``Environment`` does."""

    def __init__(self, runtime: Runtime, rules: Rules, tools: tuple[dict[str, Any], ...], name: str):
        self.runtime, self.rules, self.tools, self.name = runtime, rules, tools, name
        self._urls = rules.urls_in_turn()
        self.session = Session(self._urls[0], token=rules.token, **rules.timeouts)
        self.episode: Episode | None = None
        self.started_by: int | None = None  # the thread that started the episode, which ends its open turns
        self._finishing = threading.Lock()
        runtime.register(self)

    def start(self, split: str, index: int, task_id: str | None, prompt: list[dict] = ()) -> None:
        """Start task ``index`` of ``split`` in the background; ``prompt``, the row's, begins its transcript. The
        first start opens the session, raising when the server has no room for it."""
        if not self.session.opened:
            self.runtime.run(self._open(), len(self._urls) * self.session.reset_bound, "opening a session")
        with self._finishing:
            episode = Episode(split, index, task_id, messages=[dict(message) for message in prompt])
            self.episode, self.started_by = episode, threading.get_ident()
        self.episode.started = self.runtime.submit(self._start(self.episode))

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call, waiting for the episode's start first."""
        if self.episode is None:
            raise ToolFailed("no episode: TRL calls reset before any tool")
        episode, bound = self.episode, self.session.reset_bound + self.session.call_timeout
        episode.messages.append({"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": arguments}}]})
        try:
            result = self.runtime.run(self._play(episode, name, arguments), bound, name)
        except ToolFailed as e:
            episode.messages.append({"role": "tool", "name": name, "content": f"error: {e}"})
            if self.runtime.metrics is not None:
                self.runtime.metrics.record_failure(name, str(e))
            raise
        episode.messages.append({"role": "tool", "name": name, "content": result})
        return result

    def finish_soon(self) -> None:
        """Start ending the episode's open turns, if it has any and no one started to."""
        with self._finishing:
            episode = self.episode
            if episode is not None and episode.finished is None:
                episode.finished = self.runtime.submit(self._finish(episode))

    def reward(self, alone: bool = False) -> float | None:
        """The episode's reward once every turn has ended, or None, logging why, when it ended in an error. Starts
        ending the open turns of every episode this thread started, so a batch's end at once; ``alone``: this
        episode's only, for a trainer that scores each rollout as it ends while others still play."""
        episode = self.episode
        if episode is None:
            raise RuntimeError(f"{self.name}: get_reward() before any episode: call reset(**row) first, as "
                               "GRPOTrainer does before it generates")
        if self.rules.plain_text_replies and episode.reply is None:
            self.runtime.warn_once("plain_text_replies is on, but the trainer handed no completion to this "
                                   "environment: pass reward_funcs=env.reward_funcs to GRPOTrainer")
        self.finish_soon()
        if not alone:
            self.runtime.finish_episodes_started_here()
        bound = self.session.reset_bound + MAX_TURNS * self.session.call_timeout
        try:
            self.runtime.wait(episode.finished, bound, "ending the episode")
        except SessionError as e:
            episode.error = episode.error or str(e)
        reward = None if episode.error else self._reward(episode)
        if self.runtime.metrics is not None:
            self.runtime.metrics.record(self.name, None if reward is None else episode.scores, rollout={
                "task_id": episode.task_id or f"{episode.split}/{episode.index}", "messages": episode.messages,
                "reward": reward, "scores": episode.scores, "error": episode.error})
        if reward is None:
            logger.warning("rollout left unscored: %s", episode.error)
        return reward

    def take_reply(self, reply: str) -> None:
        """The model's last plain-text reply, which ends the turn it left open."""
        if self.episode is not None:
            self.episode.reply = reply
            if reply:
                self.episode.messages.append({"role": "assistant", "content": reply})

    def close(self) -> None:
        """Close the session, freeing its slot on the server."""
        self.runtime.unregister(self)
        self.runtime.run(self.session.close(), 2 * self.session.patience, "closing a session")

    def _reward(self, episode: Episode) -> float | None:
        rule = self.rules.reward
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

    async def _open(self) -> None:
        """Open the session on the first server in turn with room: sessions close unevenly, so one server may be
        full while another has slots. CapacityError only when every one is."""
        for url in self._urls:
            session = Session(url, token=self.rules.token, **self.rules.timeouts)
            try:
                await session.open()
            except CapacityError:
                if url == self._urls[-1]:
                    raise
            else:
                self.session = session
                return

    async def _start(self, episode: Episode) -> None:
        try:
            started = await self.session.reset(episode.split, episode.index)
            if not started.get("done") and self.rules.toolsets == "first":
                await self._check_tools(episode)
        except SessionError as e:
            episode.error = f"reset: {e}"
            return
        if started.get("done"):
            episode.error = f"reset: {(started.get('metadata') or {}).get('error')}"

    async def _check_tools(self, episode: Episode) -> None:
        """Warn when the task offers other tools than the first task's, which its class shows the model."""
        listed = (await self.session.step({"type": "list_tools"}))["observation"]["tools"]
        offered, shown = sorted(tool["name"] for tool in listed), sorted(tool["name"] for tool in self.tools)
        if offered != shown:
            self.runtime.warn_once(f"task {episode.task_id} offers the tools {offered}, not the first task's "
                                   f"{shown} that the model is shown: make the AgentEnv with toolsets='each'")

    async def _play(self, episode: Episode, name: str, arguments: dict[str, Any]) -> str:
        await asyncio.wrap_future(episode.started)
        if episode.error or episode.done:
            raise ToolFailed(f"the episode ended in an error: {episode.error}" if episode.error else
                             "the episode has ended")
        try:
            data = await self.session.step({"type": "call_tool", "tool_name": name, "arguments": arguments})
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
