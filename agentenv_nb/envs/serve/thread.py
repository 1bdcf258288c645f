"""Serve a resolved bundle's OpenEnv app (``envs.app``) on a thread of this process, for ``AgentEnv.local``:

    with serve_in_thread("bundles/gridsim-tiny", sandbox="process", max_concurrent_envs=16) as server:
        env = AgentEnv(server.url, token=server.token)

It listens on loopback and requires a token, made here unless given (AGENTENV_NB_TOKEN): another user of this
machine can reach loopback too. ``serve.processes`` serves from processes beside this one; the serve command
(``python -m agentenv_nb.envs.serve``) on an env host.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path

import uvicorn

from agentenv_nb import settings
from agentenv_nb.envs.app import Reward, build, warnings_and_up
from agentenv_nb.envs.resolve import Resolved, resolve
from agentenv_nb.envs.store import use_private_store
from agentenv_nb.lifecycle import close_at_exit
from agentenv_nb.tasks.bundles import BUNDLES_DIR


def new_token() -> str:
    """An access token no one can guess."""
    return secrets.token_urlsafe(32)


class ServerHandle:
    """A server running on a thread of this process: its ``url`` (and ``urls``), ``token``, ``max_concurrent_envs``,
    and ``close()``, which stops it (also at exit)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, shutdown_timeout: float,
                 max_concurrent_envs: int, token: str):
        self._server, self._thread, self._shutdown_timeout = server, thread, shutdown_timeout
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url, self.max_concurrent_envs, self.token = f"http://{host}:{port}", max_concurrent_envs, token
        self.urls = [self.url]
        close_at_exit(self.close)

    def close(self) -> None:
        """Stop serving, tearing down every open episode, within the shutdown timeout; then stop the env processes,
        and remove the images, that no other server of this process uses."""
        self._server.should_exit = True
        self._thread.join(self._shutdown_timeout + 5)
        from agentenv_nb.envs.process import sandbox as process_sandbox

        process_sandbox.release(self._thread.ident)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SHUTDOWN_GRACE_S = 30.0  # seconds a stopping server gives the requests in flight before it cancels them: a reset
# still deploying an env that never serves its card (agent_env waits up to 180 s for it) won't hold a restart


def serve_in_thread(bundle: str | Path | Resolved, host: str = "127.0.0.1", port: int = 0, sandbox: str | None = None,
                    max_concurrent_envs: int | None = None, reward: Reward = None, token: str | None = None,
                    start_timeout: float = 60.0, shutdown_timeout: float = SHUTDOWN_GRACE_S,
                    bundle_dir: str | Path = BUNDLES_DIR) -> ServerHandle:
    """Serve ``bundle`` (see ``resolve``) on a daemon thread; ``port=0`` takes a free one. Returns once it accepts
    connections, or raises when it didn't start within ``start_timeout`` seconds."""
    resolved = resolve(bundle, sandbox, max_concurrent_envs, bundle_dir)
    token = settings.get("token", token) or new_token()
    use_private_store()
    app = build(resolved, reward=reward, token=token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ws_ping_interval=None,
                            timeout_graceful_shutdown=shutdown_timeout)
    # Other uvicorn servers in this process (agent_env's, started with FastMCP's default "info") set uvicorn's
    # loggers back to INFO, one episode's proxy at a time; a filter outlives that, so a notebook shows uvicorn's
    # warnings and errors only, and no request line
    for name in ("uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(warnings_and_up)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"agentenv_nb.envs.serve.thread:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the server for {resolved.folder} stopped while starting (is port {port} taken?); "
                               "see the log")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server for {resolved.folder} didn't start within "
                               f"start_timeout={start_timeout:g}s")
        time.sleep(0.02)
    return ServerHandle(server, thread, shutdown_timeout, resolved.max_concurrent_envs, token)
