"""One OpenEnv WebSocket session (``/ws``) on an agent_env server, with the rules a TRL environment needs to hold it
from one rollout to the next: a session a restarting server dropped opens again once the server is back,
one whose slot another took gives up after a short wait, and the first session raises when the server has no room.

    session = Session("http://127.0.0.1:8000", reset_timeout=300, call_timeout=120, patience=4, token="...")
    await session.open()                  # CapacityError when every slot is taken
    first = await session.reset("train", 0)
    ended = await session.step({"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": "42"}})
    await session.close()

Every wait has a bound, and the SessionError raised when one runs out names it. The server plays one episode per
connection, so a dropped connection ends the episode: only ``reset`` opens the session again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from agentenv_nb import settings

CAPACITY_REACHED = "CAPACITY_REACHED"


class SessionError(Exception):
    """The session can't go on: its episode is lost, and the rollout it plays is left unscored."""


class CapacityError(SessionError):
    """The server refused a session because every one of its ``max_concurrent_envs`` slots is taken."""


class Dropped(SessionError):
    """The connection closed under the session; the server ended its episode with it."""


class Refused(SessionError):
    """The server refused the session: no access token, or the wrong one."""


class Timeout(SessionError):
    """A request got no reply within its bound."""


class Session:
    """One ``/ws`` connection, so one episode at a time; requests take turns.

    ``patience`` bounds opening a connection, and how long a dropped session waits for a slot another took;
    ``reset_timeout`` how long a reset may take, and how long a dropped session waits for a server refusing
    connections (``max(patience, reset_timeout)``); ``call_timeout`` every other request. Each unset is its
    setting's (``AGENTENV_NB_RESET_TIMEOUT``, ...; ``agentenv_nb.settings``).
    """

    def __init__(self, url: str, *, reset_timeout: float | None = None, call_timeout: float | None = None,
                 patience: float | None = None, token: str | None = None):
        self.url, self._headers = ws_url(url), {"Authorization": f"Bearer {token}"} if token else None
        self.reset_timeout, self.call_timeout, self.patience = (
            settings.get("reset_timeout", reset_timeout), settings.get("call_timeout", call_timeout),
            settings.get("patience", patience))
        self._ws: ClientConnection | None = None
        self.opened = False  # whether the session was ever open: only a first session raises at capacity
        self._turn = asyncio.Lock()

    @property
    def reset_bound(self) -> float:
        """The longest ``reset`` can take: a try, a wait for the server to come back, and a second try."""
        return 2 * self.reset_timeout + max(self.patience, self.reset_timeout) + 2 * self.patience

    async def open(self) -> None:
        """Open the session; the first time, raise CapacityError at once when the server has no room for it."""
        async with self._turn:
            await self._reopen()

    async def reset(self, split: str, index: int) -> dict[str, Any]:
        """Start task ``index`` of ``split``; a session the server dropped opens again first. Returns the reply's
        ``data`` (``observation``, ``reward``, ``done``, ``metadata``)."""
        message = {"type": "reset", "data": {"split": split, "index": index}}
        async with self._turn:
            if self._ws is None:
                await self._reopen()
            try:
                return await self._request(message, self.reset_timeout, "reset_timeout")
            except Dropped:  # gone before the reset reached an episode: the server may be restarting
                await self._reopen()
                return await self._request(message, self.reset_timeout, "reset_timeout")

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """Send one step action (``list_tools`` or ``call_tool``); returns the reply's ``data``."""
        async with self._turn:
            if self._ws is None:
                raise Dropped(f"no session on {self.url}: the connection closed and the episode with it; reset")
            return await self._request({"type": "step", "data": action}, self.call_timeout, "call_timeout")

    async def close(self) -> None:
        """Say goodbye and close the connection, within ``patience``; the server tears the episode down."""
        async with self._turn:
            ws, self._ws = self._ws, None
            if ws is None:
                return
            try:
                async with asyncio.timeout(self.patience):
                    await ws.send(json.dumps({"type": "close"}))
                    await ws.close()
            except (ConnectionClosed, OSError, TimeoutError):
                pass  # the server ends the session when the connection goes, however it goes

    async def _reopen(self) -> None:
        """Connect until the server gives this session a slot. A server refusing connections (one restarting) is
        waited for ``max(patience, reset_timeout)``, or ``patience`` before the first session; a full server
        ``patience`` once the session was open (another took its slot), and not at all for the first session."""
        loop = asyncio.get_running_loop()
        start, delay = loop.time(), 0.05
        server_wait = max(self.patience, self.reset_timeout) if self.opened else self.patience
        while True:
            try:
                self._ws = await self._connect()
                self.opened = True
                return
            except CapacityError as e:
                if not self.opened:
                    raise CapacityError(
                        f"{e}. Each environment holds one session from rollout to rollout, so the server needs a slot "
                        "for every rollout in flight (the generation batch, and the eval batch): raise "
                        "max_concurrent_envs (AgentEnv.local(..., max_concurrent_envs=N), or "
                        "`python -m agentenv_nb.envs.serve BUNDLE --max-concurrent-envs N` on the env host)") from None
                if loop.time() - start + delay > self.patience:
                    raise CapacityError(f"{e}; another session took this one's slot and none freed up within "
                                        f"patience={self.patience:g}s") from None
            except (OSError, TimeoutError, InvalidHandshake, Dropped, Timeout) as e:
                if loop.time() - start + delay > server_wait:
                    bound = "max(patience, reset_timeout)" if self.opened else "patience"
                    raise SessionError(f"the server at {self.url} refused connections for {bound}={server_wait:g}s: "
                                       f"{type(e).__name__}: {e}") from None
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def _connect(self) -> ClientConnection:
        """A connection whose session the server confirmed: it answers ``state``, or says it is full."""
        try:
            ws = await connect(self.url, open_timeout=self.patience, ping_interval=None, close_timeout=self.patience,
                               max_size=None, compression=None, proxy=None, additional_headers=self._headers)
        except InvalidURI as e:
            raise ValueError(f"{self.url} is not a WebSocket URL: {e}; pass the server's http:// address") from None
        except InvalidStatus as e:
            if e.response.status_code in (401, 403):
                raise Refused(f"{self.url} refused the session (HTTP {e.response.status_code}): it needs its access "
                              "token (AgentEnv(url, token=...) or AGENTENV_NB_TOKEN) and a client that sends no "
                              "foreign Origin") from None
            raise
        try:
            await _exchange(ws, {"type": "state"}, self.patience, "patience", self.url)
        except BaseException:
            await ws.close()
            raise
        return ws

    async def _request(self, message: dict[str, Any], bound: float, name: str) -> dict[str, Any]:
        """One request and its reply. A connection that timed out or dropped is closed: a late reply would answer
        the next request."""
        try:
            return await _exchange(self._ws, message, bound, name, self.url)
        except (Dropped, Timeout, asyncio.CancelledError):
            ws, self._ws = self._ws, None
            await ws.close()
            raise


async def _exchange(ws: ClientConnection, message: dict[str, Any], bound: float, name: str, url: str
                    ) -> dict[str, Any]:
    """Send ``message`` and read its reply within ``bound`` seconds; an error frame raises."""
    try:
        await ws.send(json.dumps(message))
    except ConnectionClosed:
        pass  # a full server sends its error frame and closes: the frame may be waiting to be read
    try:
        async with asyncio.timeout(bound):
            reply = json.loads(await ws.recv())
    except TimeoutError:
        raise Timeout(f"no reply from {url} within {name}={bound:g}s") from None
    except ConnectionClosed as e:
        raise Dropped(f"the connection to {url} closed ({e})") from None
    data = reply.get("data") or {}
    if reply.get("type") != "error":
        return data
    if data.get("code") == CAPACITY_REACHED:
        raise CapacityError(f"{url} refused a new session: all {data.get('max_sessions')} of its sessions are taken "
                            f"({CAPACITY_REACHED})")
    raise SessionError(f"the server answered {message['type']} with {data.get('code')}: {data.get('message')}")


def ws_url(url: str) -> str:
    """The ``/ws`` endpoint of a server's http(s):// (or ws(s)://) address."""
    base = url.rstrip("/").removesuffix("/ws")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            base = ws + base[len(http):]
    return base + "/ws"
