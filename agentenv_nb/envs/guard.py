"""Who may use an env server, as ASGI middleware around ``agent_env.openenv.build_app``'s app::

    app = Guard(build_app(bundle, sandbox="process"), token="s3cret", idle_timeout=600)

- With a token, every HTTP request and WebSocket handshake must carry ``Authorization: Bearer <token>``; an HTTP
  request without it gets 401, a WebSocket is refused before it opens (HTTP 403).
- Without a token, a request whose ``Host`` isn't a name of the address it reached is refused (403): on a loopback
  address only ``localhost`` or a loopback IP, elsewhere that address's IP. A web page whose name an attacker's DNS
  points at 127.0.0.1 (DNS rebinding) sends its own name as Host and Origin, and can't send a token: with one, the
  token is the boundary, and any name a proxy or a client uses for the host is served.
- A request or WebSocket handshake whose ``Origin`` isn't the server's own (a web page in a browser on the host) is
  refused: clients that aren't browsers send none.
- Episodes are played over ``/ws`` only, one a connection, so each counts against ``max_concurrent_envs``: OpenEnv's
  HTTP ``/reset``, ``/step``, ``/mcp`` and other WebSocket routes, which make envs past that limit, answer 404.
- An error a ``/ws`` client gets after an env process of its episode died says which env and how (``deaths``); a
  reset under way when one dies ends at once with that error, and the connection with it (agent_env would wait out
  its card timeout, 180 s, for a process that died as it deployed); no frame shows an env process's URL, which holds
  its episode's secret; a reset whose index or split is of the wrong kind gets an INVALID_INPUT error frame.
- A ``/ws`` session that sends nothing for ``idle_timeout`` seconds while the server waits on it is closed (code
  4408), freeing its slot; its episode ends with it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import re
from urllib.parse import urlsplit

from agentenv_nb.envs.process import deaths

IDLE_CLOSE = 4408  # a WebSocket close code of the private range: "idle for too long"
# The HTTP routes that read tasks or describe the server; none makes an env.
_ENV_URL = re.compile(r"https?://agentenv:[^@\s/]+@127\.0\.0\.1:\d+[^\s'\"]*")  # an env process's, as pool.EnvProcess.url
_READ_ONLY = re.compile(r"/(health|metadata|schema|list_environments|docs|docs/oauth2-redirect|redoc|openapi\.json"
                        r"|[^/]+/(splits|tasks|num_tasks|task|task_range))")


_LOST = re.compile(r"\b(?:Read|Write|Connect|RemoteProtocol)Error\b")  # httpx's, as a call to an env's server fails
_SAYS_NOTHING = re.compile(r'\b([A-Z]\w*Error): "')  # an exception's name and an empty message ("ReadError: "), in JSON
_DEATH_WAIT_S = 1.0  # two of the process sandbox's checks that an env process lives


async def _reported(watching: deaths.Watch) -> None:
    """Wait, up to ``_DEATH_WAIT_S``, for a death to be reported to ``watching``."""
    for _ in range(int(_DEATH_WAIT_S / 0.05)):
        if watching.reports:
            return
        await asyncio.sleep(0.05)


class Guard:
    """Refuse requests without the token, foreign origins and the routes that make envs outside ``/ws``; close idle
    sessions (see the module docstring)."""

    def __init__(self, app, token: str | None, idle_timeout: float):
        self.app, self.idle_timeout = app, idle_timeout
        self._expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if problem := self._foreign(scope, headers):
            return await _refuse(kind, send, 403, problem)
        if self._expected is not None and not hmac.compare_digest(headers.get(b"authorization", b""),
                                                                  self._expected):
            return await _refuse(kind, send, 401, "this server needs its access token: AgentEnv(url, token=...) "
                                 "or AGENTENV_NB_TOKEN")
        path = scope.get("path", "")
        if kind == "http":
            if not _READ_ONLY.fullmatch(path):
                return await _refuse(kind, send, 404, f"{path} isn't served here: episodes are played over /ws, "
                                     "one a connection")
            return await self.app(scope, receive, send)
        if path != "/ws" or b"session_id" in scope.get("query_string", b""):
            return await _refuse(kind, send, 404, "episodes are played over /ws, one a connection")
        resets = _Resets(asyncio.current_task())  # and the watch on deaths under this connection's episodes

        async def telling_deaths(message):
            if message["type"] == "websocket.send" and message.get("text"):
                resets.under_way = False  # this is the reset's reply, if one was under way
                text = _ENV_URL.sub("the env's server", message["text"])  # its URL holds the episode's secret
                if '"error"' in text and _LOST.search(text):  # its env may have died this instant: say which
                    await _reported(resets.watching)
                    text = _SAYS_NOTHING.sub(lambda m: f"{m[1]}, with no message (the env's server went away)\"", text)
                message = {**message, "text": deaths.amended(text, resets.watching.reports)}
            elif message["type"] == "websocket.close" and resets.ended and resets.under_way:
                await send(resets.error_frame())
            try:
                await send(message)
            except Exception:
                resets.closed = True  # the client went, or the server is closing the connection as it stops
                raise

        try:
            return await self.app(scope, self._idle_closing(receive, send, resets), telling_deaths)
        except asyncio.CancelledError:
            if not resets.ended or resets.task.uncancel():  # a cancel of its own, the server's stopping, goes on
                raise
        except Exception:
            # OpenEnv's handler, its reply refused by a closed connection, tries to send an error on it too and
            # raises: no one is left to tell, and uvicorn would log it as "Exception in ASGI application"
            if not resets.closed:
                raise

    def _foreign(self, scope, headers: dict) -> str | None:
        """Why a request's Host or Origin isn't this server's (see the module docstring), or None."""
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        if origin is not None and urlsplit(origin.decode("latin-1")).netloc != host:
            return "a request from another origin (a web page) isn't served"
        reached = (scope.get("server") or (None,))[0]
        name = urlsplit(f"//{host}").hostname or ""
        if reached is None or self._expected is not None or _names(name, reached):
            return None
        return (f"Host {host[:80]!r} isn't a name of this server's address {reached}: connect to "
                f"{'localhost or ' if _is_loopback(reached) else ''}{reached}")

    def _idle_closing(self, receive, send, resets: _Resets):
        """``receive`` that closes the connection, and tells the app it closed, when the client is silent for
        ``idle_timeout`` seconds; it marks a reset under way as it hands one to the app."""
        async def idle_closing():
            while True:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_timeout)
                except TimeoutError:
                    await send({"type": "websocket.close", "code": IDLE_CLOSE,
                                "reason": f"idle for {self.idle_timeout:g} s (AGENTENV_NB_IDLE_TIMEOUT)"})
                    return {"type": "websocket.disconnect", "code": IDLE_CLOSE}
                if not (problem := _bad_reset(message)):
                    resets.under_way = _reset_data(message) is not None
                    if resets.under_way:
                        resets.watching.resets += 1
                    return message
                await send({"type": "websocket.send",
                            "text": json.dumps({"type": "error", "data": {"code": "INVALID_INPUT", "message": problem}})})

        return idle_closing


class _Resets:
    """The reset under way on one connection, ended at once when an env process its episode deployed dies (not one
    of the episode before, whose death may be reported as this reset starts): its handler's task is cancelled, and the
    client gets an error frame saying which env died and how as the connection closes."""

    def __init__(self, task: asyncio.Task):
        self.task, self.under_way, self.ended, self.closed = task, False, None, False
        self.watching = deaths.watch(on_report=self.died)

    def died(self, message: str, reset: int) -> None:
        if self.under_way and reset == self.watching.resets and self.ended is None:
            self.ended = message
            self.task.cancel()

    def error_frame(self) -> dict:
        data = {"code": "EXECUTION_ERROR", "message": f"the reset failed: {self.ended}"}
        return {"type": "websocket.send",
                "text": _ENV_URL.sub("the env's server", json.dumps({"type": "error", "data": data}))}


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _is_loopback(address: str) -> bool:
    return _is_ip(address) and ipaddress.ip_address(address).is_loopback


def _names(name: str, address: str) -> bool:
    """Whether the Host name ``name`` can only mean ``address``, the server's end of the connection."""
    if _is_loopback(address):
        return name == "localhost" or name.endswith(".localhost") or _is_loopback(name)
    return _is_ip(name) and ipaddress.ip_address(name) == ipaddress.ip_address(address)


def _reset_data(message) -> dict | None:
    """The data of a reset frame the client sent, or None for any other message."""
    if message.get("type") != "websocket.receive" or '"reset"' not in (message.get("text") or ""):
        return None
    try:
        frame = json.loads(message["text"])
    except ValueError:
        return None
    data = frame.get("data", {}) if isinstance(frame, dict) and frame.get("type") == "reset" else None
    return data if isinstance(data, dict) else None


def _bad_reset(message) -> str | None:
    """What is wrong with a reset whose split or index isn't of the kind a task is named by, or None."""
    if (data := _reset_data(message)) is None:
        return None
    index, split = data.get("index", 0), data.get("split", "all")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return f"a reset's index is a task's number in its split (0, 1, ...), not {json.dumps(index)[:40]}"
    if not isinstance(split, str):
        return f"a reset's split is a split's name ('all', 'train', ...), not {json.dumps(split)[:40]}"
    return None


async def _refuse(kind: str, send, status: int, message: str) -> None:
    """An HTTP error with ``message``; a WebSocket closed before it opens, which uvicorn answers with HTTP 403 (its
    denial responses with a body log an error in uvicorn 0.54's default WebSocket protocol)."""
    if kind == "websocket":
        return await send({"type": "websocket.close", "code": 1008, "reason": message})
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
