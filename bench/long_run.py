"""An episode's cost over a long run: GridSim episodes played back to back through ``AgentEnv.local(processes=1)``
(the server a process of its own, as notebook 03 serves), the server process's CPU read every ``--window`` episodes.

    .venv/bin/python bench/long_run.py --episodes 2000 --workers 4   # a line a window, then one JSON line

``workers`` environments each play the day's optimum episode after episode, as TRL's would; every episode must score
1.0. The JSON line holds the server's CPU seconds per episode in each window, the medians of the first and last 200
episodes' windows and their ratio (the goal: within 1.2x), and the size of the store the server kept (agent_env's,
under AGENTENV_NB_STORE when set, else a folder of the server's own) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from agentenv_nb.client import AgentEnv
from agentenv_nb.tasks import gridsim


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentenv-nb-long-run-"))
    os.environ.update(AGENTENV_NB_WORK_DIR=str(work / "envs"), AGENTENV_NB_SANDBOX="process",
                      AGENTENV_NB_ENV_POOL=str(args.workers), AGENTENV_NB_STORE=str(work / "store"))
    bundle = gridsim.write_bundle(work / "gridsim", train=50, eval=1)
    played, completed, failed, lock, windows = 0, 0, [], threading.Lock(), []
    with AgentEnv.local(bundle, split="train", max_concurrent_envs=args.workers, processes=1) as env:
        server = psutil.Process(env.server.processes[0].pid)
        rows = env.dataset.to_list()

        def cpu() -> float:
            times = server.cpu_times()
            return times.user + times.system

        marks = [(0, cpu(), time.monotonic())]

        def worker() -> None:
            nonlocal played, completed
            play = env.factory()
            while True:
                with lock:
                    if played >= args.episodes:
                        return
                    index, played = played, played + 1
                play.reset(**rows[index % len(rows)])
                play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
                if (reward := play.get_reward()) != 1.0:
                    failed.append((index, reward))
                with lock:
                    completed += 1
                    if completed % args.window == 0:
                        marks.append((completed, cpu(), time.monotonic()))
                        (n0, c0, t0), (n1, c1, t1) = marks[-2], marks[-1]
                        windows.append(round((c1 - c0) / (n1 - n0), 4))
                        print(f"episodes {n0}-{n1}: server CPU {1000 * windows[-1]:.0f} ms an episode, "
                              f"{t1 - t0:.1f} s", file=sys.stderr, flush=True)

        threads = [threading.Thread(target=worker) for _ in range(args.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        store = folder_size(work / "store")
    shutil.rmtree(work, ignore_errors=True)
    per = max(1, 200 // args.window)
    first, last = statistics.median(windows[:per]), statistics.median(windows[-per:])
    print(json.dumps({"episodes": args.episodes, "workers": args.workers, "failed": failed[:10],
                      "cpu_s_per_episode": windows, "first_200": first, "last_200": last,
                      "ratio": round(last / first, 3), "store_mb": round(store / 1e6, 1),
                      "wall_s": round(marks[-1][2] - marks[0][2], 1)}))


if __name__ == "__main__":
    main()
