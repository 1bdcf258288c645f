"""A soak of the env host with faults injected: GridSim episodes played through the serve command, while env processes
are killed mid-episode and the server is restarted, then everything is stopped and what's left is counted.

    .venv/bin/python bench/soak.py --episodes 200 --workers 4 --kills 10 --restarts 1   # prints one JSON line

The server is ``python -m agentenv_nb.envs.serve`` on loopback with a token, in a work dir and store of the soak's own;
``workers`` AgentEnv environments each play the day's optimum episode after episode, as TRL's would, so every
episode a fault didn't hit scores 1.0. A kill SIGKILLs one listening env process; a restart SIGTERMs the server and
starts it again on the same port (the environments' next resets wait for it). Passes when every scored episode
scored 1.0, the unscored are at most the faults' reach (a kill's episode, a restart's episodes in flight), and
after the stop no process and no file of the run is left in the work dir, the store or /tmp.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from agentenv_nb.client import AgentEnv
from agentenv_nb.envs.process.pool import free_port
from agentenv_nb.tasks import gridsim


class Server:
    """The serve command on one port, started again by ``restart``."""

    def __init__(self, bundle: Path, work: Path, workers: int):
        self.bundle, self.port, self.token = bundle, free_port(), secrets.token_urlsafe(32)
        self.env = {**os.environ, "AGENTENV_NB_WORK_DIR": str(work / "envs"), "AGENTENV_NB_TOKEN": self.token,
                    "AGENTENV_NB_SANDBOX": "process", "AGENTENV_NB_ENV_POOL": str(workers),
                    "AGENTENV_NB_MAX_CONCURRENT_ENVS": str(workers), "TMPDIR": str(work / "tmp")}
        (work / "tmp").mkdir()
        self.log = (work / "serve.log").open("a")
        self.url, self.process = f"http://127.0.0.1:{self.port}", None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "agentenv_nb.envs.serve", str(self.bundle),
                                         "--port", str(self.port)], stdout=self.log, stderr=self.log, env=self.env)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{self.url}/health", headers={"Authorization": f"Bearer {self.token}"},
                             timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server didn't start; see {self.log.name}")
            time.sleep(0.2)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)

    def restart(self) -> None:
        self.stop()
        self.start()

    def env_processes(self) -> list[psutil.Process]:
        """The server's env processes that serve an episode's env now."""
        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if any(c.status == psutil.CONN_LISTEN for c in child.net_connections("tcp")):
                    found.append(child)
            except psutil.Error:
                pass
        return found


def soak(episodes: int, workers: int, kills: int, restarts: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="agentenv-nb-soak.") as folder:
        work = Path(folder)
        bundle = gridsim.write_bundle(work / "gridsim-soak", train=16, eval=1)
        started = time.perf_counter()
        server = Server(bundle, work, workers)
        env = AgentEnv(server.url, split="train", token=server.token, reset_timeout=120, patience=2)
        rows, results, lock, faults = env.dataset.to_list(), [], threading.Lock(), []
        # Faults at random episode counts: kills spread over the run, restarts within its middle half.
        at = sorted([(rng.randrange(episodes // 10, episodes), "kill") for _ in range(kills)]
                    + [(rng.randrange(episodes // 4, 3 * episodes // 4), "restart") for _ in range(restarts)])
        counter = iter(range(episodes))

        def work_on(play) -> None:
            for n in counter:
                row = rows[n % len(rows)]
                reward = None
                try:
                    play.reset(**row)
                    play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
                except Exception:  # a tool call a fault hit: the episode is left unscored
                    pass
                reward = play.get_reward()
                with lock:
                    results.append(reward)
                    while at and len(results) >= at[0][0]:
                        faults.append(at.pop(0)[1])
                        threading.Thread(target=inject, args=(faults[-1],)).start()

        def inject(kind: str) -> None:
            if kind == "restart":
                server.restart()
                return
            try:
                victims = server.env_processes()
                if victims:
                    os.killpg(rng.choice(victims).pid, signal.SIGKILL)
            except (psutil.Error, ProcessLookupError):  # the server was restarting
                pass

        plays = [env.factory() for _ in range(workers)]
        threads = [threading.Thread(target=work_on, args=(play,)) for play in plays]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        env.close()
        stopped = server.stop()
        seconds = time.perf_counter() - started
        time.sleep(1)
        left = {"work dir": sorted(os.listdir(work / "envs")), "tmp": sorted(os.listdir(work / "tmp")),
                "processes": [p.pid for p in psutil.process_iter(["cwd", "cmdline"])
                              if str(work) in f"{p.info['cwd']} {p.info['cmdline']}"]}
        scored = [reward for reward in results if reward is not None]
        reach = faults.count("kill") + faults.count("restart") * workers
        return {"episodes": len(results), "scored": len(scored), "all_scored_1": all(r == 1.0 for r in scored),
                "unscored": len(results) - len(scored), "faults_reach": reach, "kills": faults.count("kill"),
                "restarts": faults.count("restart"), "server_exit": stopped, "left": left,
                "seconds": round(seconds, 1),
                "ok": (all(r == 1.0 for r in scored) and len(results) - len(scored) <= reach and stopped == 0
                       and not any(left.values()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = soak(args.episodes, args.workers, args.kills, args.restarts, args.seed)
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
