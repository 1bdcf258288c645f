"""Serve a bundle's tasks as an OpenEnv server (``agent_env.openenv.build_app`` on uvicorn): inside this process for
``AgentEnv.local``, or on an env host from the command line.

    handle = serve_in_thread("bundles/gridsim-tiny", sandbox="process", max_concurrent_envs=16)
    env = AgentEnv(handle.url)        # ... and handle.close() when done; it also stops at exit

    python -m agentenv_nb.serve bundles/gridsim-tiny --host 0.0.0.0 --port 8000 --sandbox process \\
        --max-concurrent-envs 32      # then AgentEnv("http://env-host:8000") on the GPU machine

The command's defaults come from AGENTENV_NB_HOST, AGENTENV_NB_PORT, AGENTENV_NB_SANDBOX and
AGENTENV_NB_MAX_CONCURRENT_ENVS when set.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import uvicorn

Reward = str | Callable[[dict[str, float]], float] | None


def build(bundle: str | Path, *, sandbox: str | None = None, max_concurrent_envs: int = 8, reward: Reward = None):
    """The bundle's OpenEnv app: every task as the split ``all``, plus one split per eval."""
    from agent_env.openenv import build_app

    # The episode's agent proxy is polled at an a2a card path a2a calls deprecated: one warning a poll, no news.
    logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app").setLevel(logging.ERROR)

    return build_app(bundle, reward=reward, sandbox=sandbox, max_concurrent_envs=max_concurrent_envs)


def close_at_exit(close: Callable[[], None]) -> None:
    """Call the bound method ``close`` as the interpreter exits, if its object is still alive: before the thread
    pools shut down (open episodes still use them), which ``atexit`` runs too late for."""
    method = weakref.WeakMethod(close)
    threading._register_atexit(lambda: (alive := method()) is not None and alive())


class ServerHandle:
    """A server running on a thread of this process: its ``url``, and ``close()``, which stops it (also at exit)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, shutdown_timeout: float):
        self._server, self._thread, self._shutdown_timeout = server, thread, shutdown_timeout
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        close_at_exit(self.close)

    def close(self) -> None:
        """Stop serving, tearing down every open episode, within the shutdown timeout."""
        self._server.should_exit = True
        self._thread.join(self._shutdown_timeout + 5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_in_thread(bundle: str | Path, host: str = "127.0.0.1", port: int = 0, sandbox: str | None = None,
                    max_concurrent_envs: int = 8, reward: Reward = None, start_timeout: float = 60.0,
                    shutdown_timeout: float = 30.0) -> ServerHandle:
    """Serve ``bundle`` on a daemon thread; ``port=0`` takes a free one. Returns once it accepts connections, or
    raises when it didn't start within ``start_timeout`` seconds."""
    app = build(bundle, sandbox=sandbox, max_concurrent_envs=max_concurrent_envs, reward=reward)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ws_ping_interval=None,
                            timeout_graceful_shutdown=shutdown_timeout)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"agentenv_nb.serve:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the server for {bundle} stopped while starting (is port {port} taken?); see the log")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server for {bundle} didn't start within start_timeout={start_timeout:g}s")
        time.sleep(0.02)
    return ServerHandle(server, thread, shutdown_timeout)


def main(argv: list[str] | None = None) -> None:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m agentenv_nb.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a bundle folder, or an installed bundle's name")
    parser.add_argument("--host", default=env("AGENTENV_NB_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(env("AGENTENV_NB_PORT", "8000")))
    parser.add_argument("--sandbox", default=env("AGENTENV_NB_SANDBOX"),
                        help="where episodes deploy their envs, as agent-env run --sandbox (e.g. process, modal)")
    parser.add_argument("--max-concurrent-envs", type=int, default=int(env("AGENTENV_NB_MAX_CONCURRENT_ENVS", "8")),
                        help="sessions served at once: one per rollout in flight, train and eval")
    parser.add_argument("--reward", help="the step id whose score is the reward, for tasks that record several")
    args = parser.parse_args(argv)
    app = build(args.bundle, sandbox=args.sandbox, max_concurrent_envs=args.max_concurrent_envs, reward=args.reward)
    uvicorn.run(app, host=args.host, port=args.port, ws_ping_interval=None)


if __name__ == "__main__":
    main()
