"""GridSim: one grid battery for one day of day-ahead prices. The rules and score (``battery``), synthetic
prices (``prices``), and the bundle generator (``generate``).

    from agentenv_nb import gridsim
    bundle = gridsim.write_bundle("bundles/gridsim-tiny", train=16, eval=8)
    gridsim.baseline_scores(gridsim.read_days(bundle, "eval"))
"""

from .battery import BASELINES, ScheduleError, optimum, score, settle
from .generate import read_days, write_bundle


def baseline_scores(days: list[dict]) -> dict[str, float]:
    """The mean score of each baseline (idle, greedy, optimum) on ``days``, scored as the env scores them."""
    return {name: sum(score(day["prices"], rule(day["prices"])) for day in days) / len(days)
            for name, rule in BASELINES.items()}


__all__ = ["BASELINES", "ScheduleError", "baseline_scores", "optimum", "read_days", "score", "settle",
           "write_bundle"]
