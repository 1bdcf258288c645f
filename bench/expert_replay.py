"""Notebook 02's expert replay at scale: the GridSim expert's episodes on a generated bundle, served as notebook 02
serves them (``AgentEnv.local`` from server processes, the process sandbox), played ``--lanes`` at once.

    python bench/expert_replay.py --episodes 2000 --server-processes 8 --lanes 32    # prints one JSON line

Reports the wall time of ``demos.expert_demonstrations`` over the episodes (the servers already up, one warm-up batch
played first, as a notebook's first cell would have), episodes a second, how many scored 1.0, and the servers' start
(``serve_s``), which grows with the bundle (``--train-days``; each server prepares every task of it).

    python bench/expert_replay.py --episodes 32 --train-days 1600 --server-processes 1   # the start, on a small host
"""

import argparse
import json
import os
import tempfile
import time

from agentenv_nb import AgentEnv
from agentenv_nb.tasks.gridsim import write_bundle
from agentenv_nb.tasks.gridsim.adapter import play_optimum
from agentenv_nb.train.warm_start import demos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--server-processes", type=int, default=8, help="0: a thread of this process")
    parser.add_argument("--lanes", type=int, default=32, help="episodes in flight, the server's sessions")
    parser.add_argument("--train-days", type=int, help="the bundle's train days, the first --episodes played "
                                                       "(default: --episodes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        bundle = write_bundle(os.path.join(work, "gridsim"), train=max(args.episodes, args.train_days or 0), eval=1)
        started = time.perf_counter()
        with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=args.lanes,
                            processes=args.server_processes) as env:
            serve_s = time.perf_counter() - started
            days, rows = len(env.dataset), list(env.dataset_for("train", first=args.episodes))
            demos.expert_demonstrations(play_optimum, env.factory, rows[:args.lanes], concurrency=args.lanes)  # every lane's first episode
            started = time.perf_counter()
            played = demos.expert_demonstrations(play_optimum, env.factory, rows, concurrency=args.lanes)
            seconds = time.perf_counter() - started
    print(json.dumps({"episodes": len(played), "scored_1": sum(r["reward"] == 1.0 for r in played),
                      "seconds": round(seconds, 1), "episodes_per_s": round(len(played) / seconds, 1),
                      "serve_s": round(serve_s, 1), "server_processes": args.server_processes, "lanes": args.lanes,
                      "train_days": days, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
