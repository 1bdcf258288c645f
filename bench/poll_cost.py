"""What open episodes cost the env servers while the model writes: each episode's server polls its agent turn every
``poll_interval_seconds`` of the task's ``prompt_agent`` step, and agent_env makes an HTTP client a poll.

    python bench/poll_cost.py --episodes 32 --server-processes 8 --poll-s 0.1 0.25 0.5 1.0

For each interval, the GridSim bundle with its tasks' interval rewritten is served as ``AgentEnv.local`` serves it;
``episodes`` episodes are reset and started, then left open ``--seconds`` with no tool call (a model generating),
while the CPU time of the env host is counted: the server processes, and the env processes they started (each open
episode's, and those their pools keep ready). Then every episode ends at once as the expert would, each timed from its
``end_turn`` to its reward. An interval longer than ``--seconds`` leaves what open episodes cost besides the polls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from agentenv_nb.client.environment import player_of
from agentenv_nb.tasks.gridsim import battery, write_bundle


def set_poll_interval(bundle: str | Path, seconds: float) -> None:
    """Rewrite the bundle's tasks so each open episode's server polls its agent turn every ``seconds``."""
    for task in Path(bundle, "tasks").glob("*.json"):
        steps = json.loads(task.read_text())
        for step in steps:
            if step["type"] == "prompt_agent":
                step["poll_interval_seconds"] = seconds
        task.write_text(json.dumps(steps, indent=1))


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    """Each live process's CPU seconds so far, by pid."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def open_episodes_cost(poll_s: float, episodes: int, processes: int, seconds: float) -> dict:
    """One interval: the cores the env host uses with ``episodes`` open, and a turn's end."""
    from agentenv_nb import AgentEnv

    with tempfile.TemporaryDirectory() as folder:
        bundle = write_bundle(Path(folder) / "gridsim", train=episodes, eval=1)
        set_poll_interval(bundle, poll_s)
        with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=episodes,
                            processes=processes) as env:
            environments = [env.factory() for _ in range(episodes)]
            try:
                for environment, row in zip(environments, env.dataset):  # reset takes the row's every column
                    environment.reset(**row)
                for environment in environments:
                    player_of(environment).episode.started.result(300)
                days = [json.loads(environment.get_prices()) for environment in environments]
                servers = psutil.Process().children()
                host = psutil.Process().children(recursive=True)  # now with each episode's env process
                before, start = cpu_seconds(host), time.perf_counter()
                time.sleep(seconds)
                wall, after = time.perf_counter() - start, cpu_seconds(host)
                used = {pid: after[pid] - before[pid] for pid in after.keys() & before.keys()}
                servers_s = sum(used.get(server.pid, 0.0) for server in servers)

                def end(pair):
                    environment, prices = pair
                    environment.submit_schedule(schedule=battery.optimal_schedule(prices))
                    started = time.perf_counter()
                    environment.end_turn(response="done")
                    environment.get_reward()
                    return time.perf_counter() - started

                with ThreadPoolExecutor(episodes) as pool:
                    ends = list(pool.map(end, zip(environments, days)))
            finally:
                for environment in environments:
                    environment.__exit__()
    return {"poll_s": poll_s, "host_cores": sum(used.values()) / wall, "server_cores": servers_s / wall,
            "env_processes": len(host) - len(servers), "polls_a_s": episodes / poll_s,
            "turn_end_s_median": statistics.median(ends), "turn_end_s_max": max(ends)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32, help="episodes open at once (a step's rollouts)")
    parser.add_argument("--server-processes", type=int, default=8)
    parser.add_argument("--poll-s", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the episodes stay open, counted")
    args = parser.parse_args()
    rows = [open_episodes_cost(poll_s, args.episodes, args.server_processes, args.seconds) for poll_s in args.poll_s]
    print(f"{args.episodes} open episodes, {args.server_processes} server processes, {psutil.cpu_count()} cores, "
          f"{args.seconds:g} s open\n")
    print("| poll interval (s) | polls a second | env host's cores | the servers' | env processes | "
          "turn's end, median (s) | slowest (s) |\n|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['poll_s']:g} | {row['polls_a_s']:g} | {row['host_cores']:.2f} | {row['server_cores']:.2f} | "
              f"{row['env_processes']} | "
              f"{row['turn_end_s_median']:.2f} | {row['turn_end_s_max']:.2f} |")
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
