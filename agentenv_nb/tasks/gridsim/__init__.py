"""GridSim: one grid battery for one day of day-ahead prices. The rules and score (``battery``), synthetic
prices (``prices``), the bundle generator (``generate``), and what notebooks show of it (``report``).

    from agentenv_nb.tasks import gridsim
    bundle = gridsim.write_bundle("bundles/gridsim-tiny", train=16, eval=8)
    gridsim.baseline_scores(gridsim.read_days(bundle, "eval"))
"""

from .battery import BASELINES, ScheduleError, optimum, score, settle
from .generate import read_days, write_bundle
from .report import baseline_scores, plot_day


__all__ = ["BASELINES", "ScheduleError", "baseline_scores", "optimum", "plot_day", "read_days", "score", "settle",
           "write_bundle"]
