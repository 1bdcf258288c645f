"""What a notebook shows of GridSim days: the baselines' scores, and a day's prices with a schedule.

    baseline_scores(read_days(bundle, "eval"))   # {"idle": 0.2, "greedy": 0.77, "optimum": 1.0}
    plot_day(days[0])                              # prices, and the optimum's charge and sell hours
"""

from __future__ import annotations

from .battery import BASELINES, optimal_schedule, score, settle


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
