"""The episodes runtime of one ``AgentEnv``: the event loop its sessions run on, on a thread of its own, and the
registry of the players (environments) that hold them. TRL calls environments from its own threads; each call
runs here and waits for its answer within a bound, so many threads can play at once.

    runtime = Runtime("gridsim")
    runtime.run(session.open(), bound=8, what="opening a session")   # SessionError when the bound passes
    runtime.close(patience=4)                                        # every player's session, then the loop
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, Protocol

from agentenv_nb.client.session import SessionError, Session

logger = logging.getLogger(__name__)


class Registered(Protocol):
    """What the runtime keeps of a player: its session, the thread that started its episode, and how to end the
    episode's open turns."""

    session: Session
    started_by: int | None

    def finish_soon(self) -> None: ...


class Runtime:
    """An event loop on a daemon thread, the players registered on it, and the warnings said once."""

    def __init__(self, name: str):
        self.metrics = None  # the ScoreLog players record scores in, once AgentEnv.metrics made one
        self._players: list[Registered] = []
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"agentenv_nb.client:{name}",
                                        daemon=True)
        self._thread.start()

    def register(self, player: Registered) -> None:
        with self._lock:
            self._players.append(player)

    def unregister(self, player: Registered) -> None:
        with self._lock:
            self._players.remove(player)

    def finish_episodes_started_here(self) -> None:
        """Start ending, at once, the open episodes this thread started: TRL resets a batch, plays it, then reads
        its rewards one by one from that thread; an episode another thread plays is that thread's to end."""
        here = threading.get_ident()
        with self._lock:
            players = [player for player in self._players if player.started_by == here]
        for player in players:
            player.finish_soon()

    def submit(self, coroutine: Coroutine) -> Future:
        """Start ``coroutine`` on the loop."""
        if not self._loop.is_running():
            coroutine.close()
            raise RuntimeError("this AgentEnv is closed; make another")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def wait(self, future: Future, bound: float, what: str) -> Any:
        """The result of ``future``, waiting at most ``bound`` seconds."""
        try:
            return future.result(bound)
        except TimeoutError:
            future.cancel()
            raise SessionError(f"{what}: no answer within {bound:g}s") from None

    def run(self, coroutine: Coroutine, bound: float, what: str) -> Any:
        """Run ``coroutine`` on the loop and wait for it, at most ``bound`` seconds."""
        return self.wait(self.submit(coroutine), bound, what)

    def warn_once(self, message: str) -> None:
        """Log ``message`` as a warning the first time only: it would repeat every rollout."""
        with self._lock:
            if message in self._warned:
                return
            self._warned.add(message)
        logger.warning("%s", message)

    def close(self, patience: float) -> None:
        """Close every player's session, then stop the loop."""
        if not self._loop.is_running():
            return
        with self._lock:
            sessions = [player.session.close() for player in self._players]
        try:
            self.run(gather(sessions), 2 * patience, "closing the sessions")
        except SessionError as e:
            logger.warning("%s", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(patience)
        if not self._thread.is_alive():
            self._loop.close()


async def gather(coroutines: list[Coroutine], limit: int | None = None) -> list[Any]:
    """Run ``coroutines`` at once, at most ``limit`` at a time."""
    gate = asyncio.Semaphore(limit or len(coroutines) or 1)

    async def gated(coroutine: Coroutine) -> Any:
        async with gate:
            return await coroutine

    return await asyncio.gather(*map(gated, coroutines))
