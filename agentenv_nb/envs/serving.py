"""Serve a bundle's tasks as an OpenEnv server (``agent_env.openenv.build_app`` on uvicorn): for ``AgentEnv.local``
on a thread of this process or in server processes beside it, or on an env host from the command line.

    handle = serve_in_thread("bundles/gridsim-tiny", sandbox="process", max_concurrent_envs=16)
    env = AgentEnv(handle.url)        # ... and handle.close() when done; it also stops at exit
    with serve_in_processes("bundles/gridsim-tiny", processes=4, sandbox="process") as servers:
        env = AgentEnv(servers.urls)  # sessions spread over 4 processes: none holds the trainer's GIL

    python -m agentenv_nb.serve bundles/gridsim-tiny --host 0.0.0.0 --port 8000 --sandbox process \\
        --max-concurrent-envs 32      # then AgentEnv("http://env-host:8000") on the GPU machine

A bundle is a folder, a name bundles.txt lists (fetched into ``--bundle-dir``) or an installed bundle's name; with no
sandbox named, ``choice.choose_sandbox`` picks one. Each way of serving checks the bundle as it starts: every env the
process sandbox would run, its requirements included, so a bad env stops the start, not the first episode. The
command's defaults come from AGENTENV_NB_HOST, AGENTENV_NB_PORT, AGENTENV_NB_SANDBOX and
AGENTENV_NB_MAX_CONCURRENT_ENVS when set (``agentenv_nb.settings``); bad input is one line and exit status 2.
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
from agentenv_nb.envs import tls
from agentenv_nb.lifecycle import close_at_exit
from agentenv_nb.tasks.bundles import UnknownBundle, get_bundle

Reward = str | Callable[[dict[str, float]], float] | None  # a step id, or a function of the scores by step id


def prepare(bundle: str | Path, sandbox: str | None = None, bundle_dir: str | Path = "bundles"):
    """The bundle's folder (``tasks.bundles.get_bundle``) and where its envs run (a ``choice.Choice``; ``sandbox``
    forces one), after checking every env the process sandbox would run: what a server checks as it starts."""
    from agentenv_nb.envs import process_sandbox
    from agentenv_nb.envs.choice import DOCKER, PROCESS, choose_sandbox

    folder = get_bundle(bundle, bundle_dir)
    # Said unless the caller named it: a choice made here, or Docker, which may not answer (its reason says so).
    choice = choose_sandbox(folder, force=sandbox, echo=sandbox in (None, DOCKER))
    if choice.name == PROCESS:
        process_sandbox.check(folder)
    return folder, choice


def build(bundle: str | Path, *, sandbox: str | None = None, max_concurrent_envs: int = 8, reward: Reward = None,
          bundle_dir: str | Path = "bundles"):
    """The bundle's OpenEnv app: every task as the split ``all``, plus one split per eval (see ``prepare``)."""
    folder, choice = prepare(bundle, sandbox, bundle_dir)
    from agent_env.a2a_agent import conversation_store
    from agent_env.openenv import build_app

    tls.share_default_context()  # agent_env makes an httpx client a request: each would parse the CA bundle again
    # The store looks conversations up by fields only these indexes serve; without them every lookup parses every
    # conversation it holds, and a long run's episodes slow down as it grows (docs/benchmarks.md).
    conversation_store.ensure_indexes()
    # The episode's agent proxy is polled at an a2a card path a2a calls deprecated: one warning a poll, no news.
    logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app").setLevel(logging.ERROR)
    # An episode's end closes its in-process agent proxy while the env's long poll is still open: uvicorn says it
    # cancelled 0 tasks, and the proxy logs the poll's ClientDisconnect as an error with a traceback. Nothing failed.
    logging.getLogger("uvicorn.error").addFilter(_not_an_idle_shutdown)
    logging.getLogger("agentenv_protocol.a2a_agent.framework").addFilter(_not_a_client_disconnect)
    return build_app(folder, reward=reward, sandbox=choice.name, max_concurrent_envs=max_concurrent_envs)


class ServerHandle:
    """A server running on a thread of this process: its ``url``, its ``max_concurrent_envs``, and ``close()``, which
    stops it (also at exit)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, shutdown_timeout: float,
                 max_concurrent_envs: int):
        self._server, self._thread, self._shutdown_timeout = server, thread, shutdown_timeout
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url, self.max_concurrent_envs = f"http://{host}:{port}", max_concurrent_envs
        self.urls = [self.url]
        close_at_exit(self.close)

    def close(self) -> None:
        """Stop serving, tearing down every open episode, within the shutdown timeout; then stop the env processes,
        and remove the images, that no other server of this process uses."""
        self._server.should_exit = True
        self._thread.join(self._shutdown_timeout + 5)
        from agentenv_nb.envs import process_sandbox

        process_sandbox.release(self._thread.ident)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _warnings_and_up(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _not_an_idle_shutdown(record: logging.LogRecord) -> bool:
    return not (str(record.msg).startswith("Cancel %s running task(s)") and record.args == (0,))


def _not_a_client_disconnect(record: logging.LogRecord) -> bool:
    return not (record.exc_info and type(record.exc_info[1]).__name__ == "ClientDisconnect")


def serve_in_thread(bundle: str | Path, host: str = "127.0.0.1", port: int = 0, sandbox: str | None = None,
                    max_concurrent_envs: int = 8, reward: Reward = None, start_timeout: float = 60.0,
                    shutdown_timeout: float = 30.0, bundle_dir: str | Path = "bundles") -> ServerHandle:
    """Serve ``bundle`` on a daemon thread; ``port=0`` takes a free one. Returns once it accepts connections, or
    raises when it didn't start within ``start_timeout`` seconds."""
    max_concurrent_envs = settings.get("max_concurrent_envs", max_concurrent_envs)
    app = build(bundle, sandbox=sandbox, max_concurrent_envs=max_concurrent_envs, reward=reward, bundle_dir=bundle_dir)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ws_ping_interval=None,
                            timeout_graceful_shutdown=shutdown_timeout)
    # Other uvicorn servers in this process (agent_env's, started with FastMCP's default "info") set uvicorn's
    # loggers back to INFO; a filter outlives that, so a notebook shows uvicorn's warnings and errors only
    logging.getLogger("uvicorn.error").addFilter(_warnings_and_up)
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
    return ServerHandle(server, thread, shutdown_timeout, max_concurrent_envs)


class ServerProcesses:
    """``processes`` servers of one bundle, each a subprocess serving a loopback socket this process bound: ``urls``,
    one a server, the sessions they hold together (``max_concurrent_envs``), and ``close()`` (also at exit). A server
    process also stops when this process dies (its stdin closes). Sessions spread over them, so episodes deploy, play
    and score on other cores than the trainer's."""

    def __init__(self, bundle: str | Path, processes: int, host: str, options: list[str], start_timeout: float,
                 shutdown_timeout: float, env: dict[str, str] | None = None, max_concurrent_envs: int | None = None):
        self._shutdown_timeout, self.processes, self.urls = shutdown_timeout, [], []
        self.max_concurrent_envs = max_concurrent_envs
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
                       shutdown_timeout: float = 30.0, env: dict[str, str] | None = None,
                       bundle_dir: str | Path = "bundles") -> ServerProcesses:
    """Serve ``bundle`` from ``processes`` subprocesses, ``max_concurrent_envs`` sessions among them (each takes
    its share, rounded up); returns once each answers ``/health``. The bundle is checked here first (``prepare``).
    ``reward`` must be a step id here: a function can't cross to another process. ``env``: the servers' environment
    variables, if not this process's."""
    if callable(reward):
        raise ValueError("reward= is a function, which can't reach a server process: pass the step id whose score "
                         "is the reward, or serve on a thread (processes=0)")
    share = -(-settings.get("max_concurrent_envs", max_concurrent_envs) // processes)
    folder, choice = prepare(bundle, sandbox, bundle_dir)
    options = ["--max-concurrent-envs", str(share), "--sandbox", choice.name, *(["--reward", reward] if reward else [])]
    return ServerProcesses(folder, processes, host, options, start_timeout, shutdown_timeout, env, share * processes)


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


class _Parser(argparse.ArgumentParser):
    """A usage error as one line on stderr and exit status 2, as argparse's own, without the usage (``--help``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _setting(name: str) -> Callable[[str], object]:
    """An argparse type reading a flag's value as ``settings`` reads the setting's variable, range included."""
    def parse(text: str):
        try:
            return settings.parse(name, text, "--" + name.replace("_", "-"))
        except settings.SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m agentenv_nb.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a bundle folder, a name bundles.txt lists, or an installed bundle's name")
    parser.add_argument("--host", help="the address to listen on (default AGENTENV_NB_HOST, else 0.0.0.0)")
    parser.add_argument("--port", type=_setting("port"), help="default AGENTENV_NB_PORT, else 8000; 0: any free one")
    parser.add_argument("--sandbox", help="where episodes deploy their envs, as agent-env run --sandbox (process, "
                        "modal, local: Docker); default AGENTENV_NB_SANDBOX, else chosen for the bundle")
    parser.add_argument("--max-concurrent-envs", type=_setting("max_concurrent_envs"),
                        help="sessions served at once: one per rollout in flight, train and eval (default "
                        "AGENTENV_NB_MAX_CONCURRENT_ENVS, else 8)")
    parser.add_argument("--reward", help="the step id whose score is the reward, for tasks that record several")
    parser.add_argument("--bundle-dir", default="bundles", help="where a bundle bundles.txt lists is fetched to")
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # serve_in_processes: a socket it bound for us
    args = parser.parse_args(argv)
    # A bad setting or bundle is said before the server's libraries load, which takes seconds.
    try:
        host, port = settings.get("host", args.host), settings.get("port", args.port)
        max_concurrent_envs = settings.get("max_concurrent_envs", args.max_concurrent_envs)
        bundle = get_bundle(args.bundle, args.bundle_dir)
    except (settings.SettingError, UnknownBundle, OSError) as e:  # OSError: a bundle the Hub couldn't give
        parser.error(str(e))
    from agentenv_nb.envs.choice import SandboxError

    try:
        app = build(bundle, sandbox=args.sandbox, reward=args.reward, max_concurrent_envs=max_concurrent_envs)
    except (ValueError, SandboxError) as e:  # ValueError: an env a process can't run, a bundle agent_env refuses
        parser.error(str(e))
    # uvicorn shuts down gracefully on SIGTERM, then raises it again, which would skip the exit hooks that remove
    # the env processes' folders and images: exit normally instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.fd is not None:
        _serve_inherited(app, args.fd)
    else:
        uvicorn.run(app, host=host, port=port, ws_ping_interval=None)
