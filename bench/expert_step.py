"""A tool-heavy GRPO step's env work: the GridSim expert's 3 tool calls a rollout, on the kit's servers. A random
model calls no tools, so bench/gpu_grpo.py adds this to its kit step; run alone, it measures the env host's CPUs.

    python bench/expert_step.py --rollouts 32 --server-processes 8 --step-s 19.5   # % of a 19.5 s step

A step plays ``rollouts`` episodes a generation batch at a time, as TRL does: every environment reset, one by one;
then, once the episodes have started (in training they start while the model writes its first turn, seconds of
generation), get_prices on each, then submit_schedule (the day's optimum) and end_turn on each, then every
get_reward. The tool rounds run in TRL's order (one call at a time) or at once (a thread a rollout, as
``agentenv_nb.train.grpo.trainer.GRPOTrainer`` runs them). The environments live from step to step, as TRL keeps them;
the first step, which opens their sessions, is a warm-up; the median of the others is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentenv_nb.client.environment import player_of
from agentenv_nb.tasks.gridsim import battery


def play(environments: list, rows: list[dict], concurrent: bool) -> tuple[float, float, list]:
    """One generation batch: env seconds (resets, tool rounds, rewards), seconds waiting for the episodes to
    start, and the rewards."""
    with ThreadPoolExecutor(len(environments) if concurrent else 1) as pool:
        def each(call):  # one tool round: a call on every rollout's env
            return list(pool.map(call, environments)) if concurrent else [call(env) for env in environments]

        def settle(env):
            env.submit_schedule(schedule=battery.optimal_schedule(days[id(env)]))
            env.end_turn(response="done")

        start = time.perf_counter()
        for environment, row in zip(environments, rows):
            environment.reset(**row)
        resets = time.perf_counter() - start
        for environment in environments:
            player_of(environment).episode.started.result(300)
        started = time.perf_counter()
        days = dict(zip(map(id, environments), each(lambda env: json.loads(env.get_prices()))))
        each(settle)
        rewards = [environment.get_reward() for environment in environments]
        return resets + time.perf_counter() - started, started - start - resets, rewards


def expert_step(factory: type, rows: list[dict], count: int, batch: int, concurrent: bool = False,
                steps: int = 3) -> dict:
    """``steps`` steps of ``count`` rollouts, ``batch`` environments playing at once; the median step after the
    first: its env seconds, its wait for episodes to start, and the mean reward."""
    environments = [factory() for _ in range(batch)]
    timed = []
    try:
        for _ in range(steps):
            env_s = start_s = 0.0
            rewards = []
            for first in range(0, count, batch):
                playing = environments[:min(batch, count - first)]
                seconds, waited, scores = play(playing, [rows[(first + i) % len(rows)] for i in range(len(playing))],
                                               concurrent)
                env_s, start_s, rewards = env_s + seconds, start_s + waited, rewards + scores
            timed.append((env_s, start_s, sum(r or 0.0 for r in rewards) / count))
    finally:
        for environment in environments:
            environment.__exit__()
    key = "env_tools_concurrent" if concurrent else "env_tools"
    rest = timed[1:] or timed
    return {f"{key}_s": statistics.median(t[0] for t in rest), f"{key}_start_s": statistics.median(t[1] for t in rest),
            f"{key}_reward": statistics.median(t[2] for t in rest)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=32, help="a step's rollouts")
    parser.add_argument("--batch", type=int, default=32, help="rollouts generated at once (the generation batch)")
    parser.add_argument("--server-processes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="steps played, the first a warm-up")
    parser.add_argument("--step-s", type=float, help="a step's seconds, to give the env's share of it")
    args = parser.parse_args()
    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks.gridsim import write_bundle

    with tempfile.TemporaryDirectory() as folder, AgentEnv.local(
            write_bundle(Path(folder) / "gridsim", train=64, eval=4), split="train", sandbox="process",
            max_concurrent_envs=2 * args.batch, processes=args.server_processes) as env:
        results = {}
        for concurrent in (False, True):
            results.update(expert_step(env.factory, env.dataset.to_list(), args.rollouts, args.batch, concurrent,
                                       args.steps))
    print(f"{args.rollouts} rollouts a step, {args.batch} at once, {args.server_processes} server processes; "
          f"median of {args.steps - 1} steps after a warm-up\n")
    print("| tool rounds | env s a step | % of a step | episodes' start, behind generation (s) | reward |\n"
          "|---|---|---|---|---|")
    for name, key in (("TRL's order", "env_tools"),
                      ("at once (agentenv_nb.train.grpo.trainer)", "env_tools_concurrent")):
        share = f"{100 * results[key + '_s'] / args.step_s:.1f}" if args.step_s else "-"
        print(f"| {name} | {results[key + '_s']:.2f} | {share} | {results[key + '_start_s']:.2f} | "
              f"{results[key + '_reward']:.2f} |")


if __name__ == "__main__":
    main()
