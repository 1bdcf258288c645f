"""Serve a bundle's tasks as an OpenEnv server (``agent_env.openenv.build_app`` on uvicorn): for ``AgentEnv.local``
on a thread of this process or in server processes beside it, or on an env host from the command line.

    handle = serve_in_thread("bundles/gridsim-tiny", sandbox="process", max_concurrent_envs=16)
    env = AgentEnv(handle.url)        # ... and handle.close() when done; it also stops at exit
    with serve_in_processes("bundles/gridsim-tiny", processes=4, sandbox="process") as servers:
        env = AgentEnv(servers.urls)  # sessions spread over 4 processes: none holds the trainer's GIL

    python -m agentenv_nb.serve bundles/gridsim-tiny --host 0.0.0.0 --port 8000 --sandbox process \\
        --max-concurrent-envs 32      # then AgentEnv("http://env-host:8000") on the GPU machine

The command's defaults come from AGENTENV_NB_HOST, AGENTENV_NB_PORT, AGENTENV_NB_SANDBOX and
AGENTENV_NB_MAX_CONCURRENT_ENVS when set (``agentenv_nb.settings``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn

from agentenv_nb import settings
from agentenv_nb.lifecycle import close_at_exit

Reward = str | Callable[[dict[str, float]], float] | None  # a step id, or a function of the scores by step id


def build(bundle: str | Path, *, sandbox: str | None = None, max_concurrent_envs: int = 8, reward: Reward = None):
    """The bundle's OpenEnv app: every task as the split ``all``, plus one split per eval."""
    from agent_env.a2a_agent import conversation_store
    from agent_env.openenv import build_app

    # The store looks conversations up by fields only these indexes serve; without them every lookup parses every
    # conversation it holds, and a long run's episodes slow down as it grows (docs/benchmarks.md).
    conversation_store.ensure_indexes()
    # The episode's agent proxy is polled at an a2a card path a2a calls deprecated: one warning a poll, no news.
    logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app").setLevel(logging.ERROR)

    return build_app(bundle, reward=reward, sandbox=sandbox, max_concurrent_envs=max_concurrent_envs)


class ServerHandle:
    """A server running on a thread of this process: its ``url``, and ``close()``, which stops it (also at exit)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, shutdown_timeout: float):
        self._server, self._thread, self._shutdown_timeout = server, thread, shutdown_timeout
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.urls = [self.url]
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
    thread = threading.Thread(target=server.run, name=f"agentenv_nb.envs.serving:{port}", daemon=True)
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


class ServerProcesses:
    """``processes`` servers of one bundle, each a subprocess serving a loopback socket this process bound: ``urls``,
    one a server, and ``close()`` (also at exit). A server process also stops when this process dies (its stdin
    closes). Sessions spread over them, so episodes deploy, play and score on other cores than the trainer's."""

    def __init__(self, bundle: str | Path, processes: int, host: str, options: list[str], start_timeout: float,
                 shutdown_timeout: float, env: dict[str, str] | None = None):
        self._shutdown_timeout, self.processes, self.urls = shutdown_timeout, [], []
        self.logs = Path(tempfile.mkdtemp(prefix="agentenv-nb-servers."))
        close_at_exit(self.close)
        try:
            for i in range(processes):
                with socket.create_server((host, 0)) as listening:
                    log = self.logs / f"server-{i}.log"
                    command = [sys.executable, "-m", "agentenv_nb.serve", str(bundle), "--fd", str(listening.fileno()),
                               *options]
                    with log.open("wb") as out:
                        self.processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out,
                                                                stderr=subprocess.STDOUT, env=env,
                                                                pass_fds=(listening.fileno(),)))
                    self.urls.append("http://{}:{}".format(*listening.getsockname()[:2]))
            self._wait_healthy(start_timeout)
        except BaseException as e:
            self.close(keep_logs=isinstance(e, TimeoutError))  # its message points at them; others quote them
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline, waiting = time.monotonic() + timeout, dict(enumerate(self.urls))
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while waiting:
                for i, url in list(waiting.items()):
                    if self.processes[i].poll() is not None:
                        tail = (self.logs / f"server-{i}.log").read_text(errors="replace")[-2000:]
                        raise RuntimeError(f"server process {i} for {url} exited while starting:\n{tail}")
                    try:
                        if client.get(f"{url}/health").status_code == 200:
                            del waiting[i]
                    except httpx.TransportError:
                        pass
                if waiting and time.monotonic() > deadline:
                    raise TimeoutError(f"{len(waiting)} server process(es) didn't answer /health within "
                                       f"start_timeout={timeout:g}s; their logs are in {self.logs}")
                time.sleep(0.1 if waiting else 0)

    def close(self, keep_logs: bool = False) -> None:
        """Stop every server: SIGTERM, which tears down its open episodes; SIGKILL after the shutdown timeout. Their
        logs (``logs``, while they run) go too, unless ``keep_logs``."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + self._shutdown_timeout + 5
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdin:
                process.stdin.close()
        if not keep_logs:
            shutil.rmtree(self.logs, ignore_errors=True)

    def __enter__(self) -> ServerProcesses:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_in_processes(bundle: str | Path, processes: int, host: str = "127.0.0.1", sandbox: str | None = None,
                       max_concurrent_envs: int = 8, reward: str | None = None, start_timeout: float = 120.0,
                       shutdown_timeout: float = 30.0, env: dict[str, str] | None = None) -> ServerProcesses:
    """Serve ``bundle`` from ``processes`` subprocesses, ``max_concurrent_envs`` sessions among them (each takes
    its share, rounded up); returns once each answers ``/health``. ``reward`` must be a step id here: a function
    can't cross to another process. ``env``: the servers' environment variables, if not this process's."""
    if callable(reward):
        raise ValueError("reward= is a function, which can't reach a server process: pass the step id whose score "
                         "is the reward, or serve on a thread (processes=0)")
    options = ["--max-concurrent-envs", str(-(-max_concurrent_envs // processes)),
               *(["--sandbox", sandbox] if sandbox else []), *(["--reward", reward] if reward else [])]
    return ServerProcesses(bundle, processes, host, options, start_timeout, shutdown_timeout, env)


def _serve_inherited(app, fd: int) -> None:
    """Serve ``app`` on the listening socket ``fd`` a parent handed over, until it closes this process's stdin."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_ping_interval=None,
                                           timeout_graceful_shutdown=30))

    def stop_with_parent() -> None:
        while os.read(0, 4096):  # os.read: a daemon thread inside sys.stdin's reader would abort the exit
            pass
        server.should_exit = True

    threading.Thread(target=stop_with_parent, daemon=True).start()
    server.run(sockets=[socket.socket(fileno=fd)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_nb.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a bundle folder, or an installed bundle's name")
    parser.add_argument("--host", default=settings.get("host"))
    parser.add_argument("--port", type=int, default=settings.get("port"))
    parser.add_argument("--sandbox", default=settings.get("sandbox"),
                        help="where episodes deploy their envs, as agent-env run --sandbox (e.g. process, modal)")
    parser.add_argument("--max-concurrent-envs", type=int, default=settings.get("max_concurrent_envs"),
                        help="sessions served at once: one per rollout in flight, train and eval")
    parser.add_argument("--reward", help="the step id whose score is the reward, for tasks that record several")
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # serve_in_processes: a socket it bound for us
    args = parser.parse_args(argv)
    app = build(args.bundle, sandbox=args.sandbox, max_concurrent_envs=args.max_concurrent_envs, reward=args.reward)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again, which would skip the exit hooks that remove
    # the env processes' folders and images: exit normally instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.fd is not None:
        _serve_inherited(app, args.fd)
    else:
        uvicorn.run(app, host=args.host, port=args.port, ws_ping_interval=None)

