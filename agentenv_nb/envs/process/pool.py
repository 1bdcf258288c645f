"""Env processes for the process sandbox: a fresh one per episode, killed with all it started (its process group)
and its folder (in ``image.work_dir()``); as root each gets its own /data and /tmp (a mount namespace).
``Pool(image, env, size=N)`` keeps N ready per image and environment, forked from a parent that imported the env's
libraries once (``zygote``), and starts more as they're taken; ``size=0`` starts each as a fresh interpreter when
asked, as ``python server.py`` would::

    process = await pool_for(image, {"ENVIRONMENT_NAME": "echo"}, size=8).take(start_timeout=60)  # serves at .url
    process.kill()
    close_pools()  # at shutdown: every pool, its parent and its ready processes
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from agentenv_nb import settings
from agentenv_nb.envs.process import zygote
from agentenv_nb.envs.process.image import EnvImage
from agentenv_nb.envs.workdir import env_ids, owned_prefix, work_dir

_POLL_S = 0.01
_PORT_TRIES = 3  # starts of an env process whose port another process took before it bound it (see free_port)
_SERVER_LIBRARIES = ("mcp.server.fastmcp", "uvicorn")  # what agentenv_protocol's serve() imports when it runs
# What an env process keeps of the server's environment: how to find programs, libraries and the locale. Nothing
# else reaches it (HF_TOKEN, MODAL_TOKEN_SECRET, AGENTENV_NB_TOKEN, cloud keys): only its image's ENV and its deploy's.
_KEPT = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR")


def env_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment an env process starts with: ``_KEPT`` and the locale of this one's, then ``env``."""
    kept = {name: value for name, value in os.environ.items() if name in _KEPT or name.startswith("LC_")}
    return {**kept, "HOME": "/tmp", **env}


class EnvStartError(RuntimeError):
    """An env process that exited, or didn't listen in time; the message holds its output's tail."""


def private_folders() -> list[str]:
    """The folders a process gets of its own: none without root; else /data (made if missing) and /tmp, into which
    what it reads there (the work dir, this Python, its packages) is bound back (``zygote``)."""
    if os.geteuid() != 0:
        return []
    Path("/data").mkdir(exist_ok=True)
    return ["data", "tmp"]


def read_paths() -> list[str]:
    """What an env process reads besides its app: the work dir, this Python and its packages (their real paths)."""
    read = [work_dir(), Path(sys.base_prefix), Path(sys.prefix), Path(__file__).parent,
            *(Path(entry) for entry in sys.path if entry)]
    return sorted({str(path.resolve()) for path in read if path.exists()})


@dataclass
class EnvProcess:
    """One env process: its pid (its process group's), loopback port, folder, and the secret its port requires."""

    pid: int
    port: int
    root: Path
    secret: str
    popen: subprocess.Popen | None = None  # when this process started it; a forking parent reaps its own
    exits: Path | None = None  # where that parent says how each child ended
    on_kill: Callable[[], None] | None = None  # called once, when it's killed

    @property
    def url(self) -> str:
        """Where the episode reaches it: the secret rides as the URL's user info, which httpx sends as Basic auth."""
        return f"http://{zygote.SECRET_USER}:{self.secret}@127.0.0.1:{self.port}"

    @property
    def private(self) -> bool:
        """Whether its /data is its own, mounted from ``root / "data"``."""
        return (self.root / zygote.PRIVATE_MARK).exists()

    def listening(self) -> bool:
        """Whether its server accepts connections, so it serves its card (``zygote`` marks it)."""
        return (self.root / zygote.READY_MARK).exists()

    def alive(self) -> bool:
        return self.popen.poll() is None if self.popen is not None else psutil.pid_exists(self.pid)

    def kill(self) -> None:
        """Kill its process group and remove its folder; idempotent."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.exits is not None:  # one its parent writes after this stays till the pool closes
            (self.exits / str(self.pid)).unlink(missing_ok=True)
        on_kill, self.on_kill = self.on_kill, None
        if on_kill is not None:
            on_kill()

    def how_it_ended(self) -> str:
        """How the process ended: its exit status or the signal that killed it, as far as it's known."""
        code = self.popen.poll() if self.popen is not None else None
        if self.exits is not None:
            with contextlib.suppress(OSError, ValueError):
                code = int((self.exits / str(self.pid)).read_text())
        if code is None:
            return "it ended (how isn't known)"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"it exited with status {code}"

    def output(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "log").read_text("utf8", errors="replace")[-chars:]
        return ""


class Pool:
    """Fresh env processes of one image and environment, kept ready ahead of need: ``size``, or as many as were in use
    at once so far when that's more, so a burst of resets as large as the last finds all its processes ready; back to
    ``size`` once none was taken for AGENTENV_NB_IDLE_TIMEOUT seconds."""

    def __init__(self, image: EnvImage, env: dict[str, str], size: int):
        self.image, self.size = image, size
        self.env = env_environment({**image.env, **env, "MCP_HOST": "127.0.0.1"})
        self.private, self.reads = private_folders(), read_paths()
        self._ready: collections.deque[EnvProcess] = collections.deque()
        self._lock = threading.Lock()  # the ready processes and the counts: held briefly, also on the event loop
        self._forking = threading.Lock()  # the parent's pipe: held while it forks, so off the event loop only
        self._start_timeout = 60.0
        self._wanted, self._closed, self._in_use, self.peak = threading.Event(), False, 0, 0  # peak: most in use yet
        self._zygote, self._thread = None, None  # the forking parent (a Popen); the refilling thread
        self._idle_after, self._taken_at = settings.get("idle_timeout"), time.monotonic()
        self._exits: Path | None = None  # where the forking parent says how each child ended

    async def take(self, start_timeout: float) -> EnvProcess:
        """A ready process no one has used: a warm one, else one started now."""
        self._start_timeout, self._taken_at = start_timeout, time.monotonic()
        while self.size:
            with self._lock:
                process = self._ready.popleft() if self._ready else None
            self._refill()
            if process is None:
                break
            if process.alive():
                return self._handed(process)
            process.kill()
        for attempt in range(1, _PORT_TRIES + 1):
            # Without a pool, on this (the event loop's) thread: a process dies with the thread that started it.
            process = await asyncio.to_thread(self._start) if self.size else self._start()
            try:
                await _ready(process, start_timeout)
                return self._handed(process)
            except BaseException as e:
                process.kill()
                port_taken = isinstance(e, EnvStartError) and "address already in use" in str(e).lower()
                if not port_taken or attempt == _PORT_TRIES:
                    raise

    @property
    def ready(self) -> int:
        """How many started processes wait to be taken."""
        return len(self._ready)

    def _handed(self, process: EnvProcess) -> EnvProcess:
        with self._lock:
            self._in_use += 1
            self.peak = max(self.peak, self._in_use)
        process.on_kill = self._returned
        return process

    def _returned(self) -> None:
        with self._lock:
            self._in_use -= 1

    def close(self) -> None:
        """Kill the ready processes and the forking parent, and so all it forked; ``pool_for`` then makes another."""
        self._closed = True
        self._wanted.set()
        if self._thread is not None:  # a refill under way kills what it starts once it sees the pool closed
            self._thread.join(self._start_timeout + 5)
        with self._lock:
            ready, self._ready = list(self._ready), collections.deque()
        for process in ready:
            process.kill()
        if self._zygote is not None:
            self._zygote.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._zygote.wait(timeout=5)
            self._zygote.kill()  # does nothing once it has exited
            self._zygote.wait()
        if self._exits is not None:
            shutil.rmtree(self._exits, ignore_errors=True)

    def _start(self) -> EnvProcess:
        """Start a process: forked from the parent when there's a pool, else a fresh interpreter."""
        root = Path(tempfile.mkdtemp(prefix=owned_prefix("env"), dir=work_dir()))
        try:
            ids = env_ids()
            for folder in (root, root / "data", root / "tmp"):
                folder.mkdir(exist_ok=True)
                if ids is not None:  # the process's own, as the user id it runs as
                    os.chown(folder, *ids)
            port, secret = free_port(), secrets.token_urlsafe(24)
            process = {"app_dir": str(self.image.app_dir), "script": str(self.image.script),
                       "args": list(self.image.args), "env": self.env, "port": port, "root": str(root),
                       "private": self.private, "secret": secret, "ids": ids, "reads": self.reads}
            if not self.size:  # the process json on stdin: a command line is every local user's to read
                popen = subprocess.Popen([sys.executable, zygote.__file__, "run"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env, text=True)
                popen.stdin.write(json.dumps(process))
                popen.stdin.close()
                return EnvProcess(popen.pid, port, root, secret, popen)
            with self._forking:
                parent = self._zygote_running()
                parent.stdin.write(json.dumps(process) + "\n")
                parent.stdin.flush()
                answer = parent.stdout.readline()
            if not answer:
                raise EnvStartError(f"the parent that forks {self.image.script.name} exited")
            return EnvProcess(json.loads(answer)["pid"], port, root, secret, exits=self._exits)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _zygote_running(self) -> subprocess.Popen:
        if self._closed:
            raise EnvStartError("the pool is closed")
        if self._zygote is None or self._zygote.poll() is not None:
            if self._exits is None:
                self._exits = Path(tempfile.mkdtemp(prefix=owned_prefix("exits"), dir=work_dir()))
            self._zygote = subprocess.Popen(
                [sys.executable, zygote.__file__, "fork", json.dumps([*self.image.preload, *_SERVER_LIBRARIES]),
                 str(self._exits)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                cwd=self.image.app_dir, env=self.env, start_new_session=True)
        return self._zygote

    def _refill(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep_ready, name="agentenv-nb-env-pool", daemon=True)
            self._thread.start()
        self._wanted.set()

    def _keep_ready(self) -> None:
        """Top the ready processes up whenever one is taken, starting the missing ones at once."""
        while not self._closed:
            if not self._wanted.wait(self._idle_after):
                self._shrink()
                continue
            self._wanted.clear()
            with self._lock:
                missing = max(self.size, self.peak) - len(self._ready)
            started: list[EnvProcess] = []
            try:
                for _ in range(max(missing, 0) if not self._closed else 0):
                    started.append(self._start())
                for process in _as_ready(started, self._start_timeout):
                    with self._lock:
                        if self._closed:
                            process.kill()
                        else:
                            self._ready.append(process)
            except Exception:  # a take() starts its own, and reports why it fails
                for process in started:
                    if process not in self._ready:
                        process.kill()
                time.sleep(1)

    def _shrink(self) -> None:
        """After a burst, once none was taken for AGENTENV_NB_IDLE_TIMEOUT seconds, keep only ``size`` ready (or as
        many as are in use, if more): a burst's warm processes, each an interpreter's memory, would otherwise stay till
        the pool closes."""
        with self._lock:
            if time.monotonic() - self._taken_at < self._idle_after:
                return
            self.peak = self._in_use
            keep = max(self.size, self.peak)
            extra = [self._ready.pop() for _ in range(max(0, len(self._ready) - keep))]
        for process in extra:
            process.kill()


_pools: dict[tuple, Pool] = {}
_pools_lock = threading.Lock()


def pool_for(image: EnvImage, env: dict[str, str], size: int) -> Pool:
    """The pool of ``image`` started with ``env``, made on first use."""
    key = (image.key, tuple(sorted(env.items())), size)
    with _pools_lock:
        if key not in _pools or _pools[key]._closed:
            _pools[key] = Pool(image, env, size)
        return _pools[key]


def pools() -> list[Pool]:
    """The open pools."""
    with _pools_lock:
        return [pool for pool in _pools.values() if not pool._closed]


def close_pools() -> None:
    """Close every pool: its ready processes and its forking parent."""
    for pool in pools():
        pool.close()


async def _ready(process: EnvProcess, timeout: float) -> None:
    """Wait until ``process`` listens; raise EnvStartError if it exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not process.listening():
        if failed := _failed(process, deadline, timeout):
            raise EnvStartError(failed)
        await asyncio.sleep(_POLL_S)


def _as_ready(processes: list[EnvProcess], timeout: float) -> Iterator[EnvProcess]:
    """Each of the processes as soon as it listens, from a thread; kills and leaves out any that fails to."""
    deadline, waiting = time.monotonic() + timeout, list(processes)
    while waiting:
        for process in list(waiting):
            if process.listening():
                waiting.remove(process)
                yield process
            elif _failed(process, deadline, timeout):
                waiting.remove(process)
                process.kill()
        time.sleep(2 * _POLL_S)


def _failed(process: EnvProcess, deadline: float, timeout: float) -> str | None:
    """Why a process that doesn't listen yet never will: it exited, or ``deadline`` passed; else None."""
    if not process.alive():
        return f"the env process exited before it listened; its output:\n{process.output()}"
    if time.monotonic() > deadline:
        return (f"the env process didn't listen in {timeout:g} s (AGENTENV_NB_ENV_START_TIMEOUT); "
                f"its output:\n{process.output()}")
    return None


def free_port() -> int:
    """A loopback port free now. The env binds it later, so another process may take it first: zygote then marks
    the env ready only for a listener of its own, and ``Pool.take`` starts another on a new port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
