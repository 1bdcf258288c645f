"""Serve a resolved bundle from server processes beside this one, for ``AgentEnv.local(..., processes=N)``: each a
``python -m agentenv_nb.envs.serve`` on a loopback socket this process bound, handed the ``Resolved`` bundle and the
token instead of resolving again, so sessions deploy, play and score on other cores than the trainer's.

    with serve_in_processes("bundles/gridsim-tiny", processes=4, sandbox="process") as servers:
        env = AgentEnv(servers.urls, token=servers.token)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

from agentenv_nb import settings
from agentenv_nb.envs import rewards
from agentenv_nb.envs.resolve import Resolved, resolve
from agentenv_nb.envs.rewards import Reward
from agentenv_nb.envs.serve.thread import SHUTDOWN_GRACE_S, new_token
from agentenv_nb.lifecycle import close_at_exit
from agentenv_nb.tasks.bundles import BUNDLES_DIR


MOST_SERVERS = 8  # the most server processes ``servers_for_host`` gives, whatever the cores


def servers_for_host(most: int = MOST_SERVERS) -> int:
    """Env server processes for this host: one a core this process may run on, at most ``most``. Each prepares the
    whole bundle as it starts, so more processes than cores start slower and play no faster (docs/benchmarks.md)."""
    return min(most, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class ServerProcesses:
    """``processes`` servers of one resolved bundle: ``urls``, one a server, their ``token``, the sessions they hold
    together (``max_concurrent_envs``, the resolved bundle's: each server holds its share, rounded up), and
    ``close()`` (also at exit). A server process also stops when this process dies (its stdin closes)."""

    def __init__(self, resolved: Resolved, processes: int, host: str, reward: Reward, token: str,
                 start_timeout: float, shutdown_timeout: float, env: dict[str, str] | None = None):
        from agentenv_nb.envs.workdir import owned_prefix, work_dir

        self._shutdown_timeout, self.processes, self.urls, self.token = shutdown_timeout, [], [], token
        self.max_concurrent_envs = resolved.max_concurrent_envs
        self.logs = Path(tempfile.mkdtemp(prefix=owned_prefix("servers"), dir=work_dir()))  # private, swept if left
        close_at_exit(self.close)
        share = -(-resolved.max_concurrent_envs // processes)
        options = ["--resolved", replace(resolved, max_concurrent_envs=share).to_json()]
        if reward is not None:  # pickled into the private folder: a name, a step id or a combinator alike
            (self.logs / "reward.pickle").write_bytes(rewards.pickled(reward))
            options += ["--reward-file", str(self.logs / "reward.pickle")]
        env = {**(os.environ if env is None else env), settings.SETTINGS["token"].variable: token}
        try:
            for i in range(processes):
                with socket.create_server((host, 0)) as listening:
                    log = self.logs / f"server-{i}.log"
                    command = [sys.executable, "-m", "agentenv_nb.envs.serve", "--fd", str(listening.fileno()),
                               *options]
                    with log.open("wb") as out:
                        self.processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out,
                                                                stderr=subprocess.STDOUT, env=env,
                                                                pass_fds=(listening.fileno(),)))
                    self.urls.append("http://{}:{}".format(*listening.getsockname()[:2]))
            self._wait_healthy(start_timeout)
        except BaseException:
            self.close()  # the error quotes what the servers wrote: their folder goes with them
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline, waiting = time.monotonic() + timeout, dict(enumerate(self.urls))
        with httpx.Client(timeout=2.0, trust_env=False, headers={"Authorization": f"Bearer {self.token}"}) as client:
            while waiting:
                for i, url in list(waiting.items()):
                    if self.processes[i].poll() is not None:
                        raise RuntimeError(f"server process {i} for {url} exited while starting:\n{self._tail(i)}")
                    try:  # a server that accepted but hasn't answered holds this call: no longer than the deadline
                        patience = min(2.0, max(0.05, deadline - time.monotonic()))
                        if client.get(f"{url}/health", timeout=patience).status_code == 200:
                            del waiting[i]
                    except httpx.TransportError:
                        pass
                if waiting and time.monotonic() > deadline:
                    written = "".join(f"\nserver process {i} wrote:\n{tail}" for i in waiting
                                      if (tail := self._tail(i)))
                    raise TimeoutError(f"{len(waiting)} of {len(self.urls)} server processes didn't answer /health "
                                       f"within start_timeout={timeout:g}s: start fewer (processes=) or give them "
                                       f"longer (start_timeout=)" + (written or "; they wrote nothing"))
                time.sleep(0.1 if waiting else 0)

    def _tail(self, i: int) -> str:
        return (self.logs / f"server-{i}.log").read_text(errors="replace")[-2000:]

    def close(self) -> None:
        """Stop every server: SIGTERM, which tears down its open episodes; SIGKILL after the shutdown timeout. Their
        logs (``logs``, while they run) go too."""
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
        shutil.rmtree(self.logs, ignore_errors=True)

    def __enter__(self) -> ServerProcesses:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_in_processes(bundle: str | Path | Resolved, processes: int, host: str = "127.0.0.1",
                       sandbox: str | None = None, max_concurrent_envs: int | None = None, reward: Reward = None,
                       token: str | None = None, start_timeout: float = 120.0,
                       shutdown_timeout: float = SHUTDOWN_GRACE_S, env: dict[str, str] | None = None,
                       bundle_dir: str | Path = BUNDLES_DIR) -> ServerProcesses:
    """Serve ``bundle`` (resolved here first, see ``resolve``) from ``processes`` subprocesses,
    ``max_concurrent_envs`` sessions among them; returns once each answers
    ``/health``. ``reward`` (``envs.rewards``) must pickle to reach them: a name, a step id, ``Weighted``, a function
    at a module's top level. ``env``: the servers' environment variables, if not this process's."""
    rewards.pickled(reward)  # a reward no server process could read is refused before any starts
    resolved = resolve(bundle, sandbox, max_concurrent_envs, bundle_dir)
    return ServerProcesses(resolved, processes, host, reward, settings.get("token", token) or new_token(),
                           start_timeout, shutdown_timeout, env)
