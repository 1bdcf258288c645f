"""What a notebook shows of GridSim days: the baselines' scores, a day's prices with a schedule, and the recipe page's
table of trainers (``REFERENCE``).

    baseline_scores(read_days(bundle, "eval"))   # {"idle": 0.2, "greedy": 0.77, "optimum": 1.0}
    plot_day(days[0])                              # prices, and the optimum's charge and sell hours
"""

from __future__ import annotations

from .battery import BASELINES, optimal_schedule, score, settle

REFERENCE: dict[str, dict[int, float]] = {
    "Unsloth": {0: 0.55, 20: 0.52, 40: 0.59},
    "TRL": {0: 0.57, 20: 0.56, 40: 0.61},
    "SkyRL": {0: 0.54, 20: 0.55, 40: 0.61},
    "verl": {0: 0.52, 20: 0.59, 40: 0.60},
    "prime-rl": {0: 0.56, 20: 0.58, 40: 0.57},
    "NeMo RL": {0: 0.55, 20: 0.68, 40: 0.67},
}
"""Eval reward by GRPO step, one run per trainer: the recipe page's
(https://www.agentenvframework.com/docs/training/unsloth) table "Qwen3-4B, eval reward on the 200 eval days". Measured
on the real gridsim-v1 bundle with Qwen3-4B after an SFT warm start (about ±0.06 between runs), so it is a reference
for what a real run looks like, not a target for the tiny model."""


def baseline_scores(days: list[dict]) -> dict[str, float]:
    """The mean score of each baseline (idle, greedy, optimum) on ``days``, scored as the env scores them."""
    return {name: sum(score(day["prices"], rule(day["prices"])) for day in days) / len(days)
            for name, rule in BASELINES.items()}


def plot_day(day: dict, schedule: list[int] | None = None, ax=None):
    """A bar chart of the day's prices, the hours ``schedule`` (default: the optimum) charges in green and sells
    in red; returns the axes."""
    import matplotlib.pyplot as plt

    prices = day["prices"]
    schedule = optimal_schedule(prices) if schedule is None else schedule
    _, taken = settle(prices, schedule)
    ax = ax or plt.subplots(figsize=(9, 3))[1]
    colors = ["tab:green" if a > 0 else "tab:red" if a < 0 else "lightgray" for a in taken]
    ax.bar(range(len(prices)), prices, color=colors)
    ax.set(xlabel="hour", ylabel="$/MWh", title=f"{day['day']}: charge (green), sell (red); score "
                                                f"{score(prices, schedule):.2f}")
    ax.figure.tight_layout()
    return ax
