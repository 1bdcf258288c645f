"""GridSim's task adapter (the interface ``tasks.adapters.TaskAdapter`` describes, which lists this one first): the
day's exact optimum as the expert, the idle, greedy and optimum baselines, a day's prices, and the recipe page's table
of trainers on gridsim-v1."""

from __future__ import annotations

import json
from pathlib import Path

from .battery import optimal_schedule
from .generate import ENV_NAME, read_days
from .report import REFERENCE, baseline_scores, plot_day


DONE = "I submitted the day's schedule."


class GridSimAdapter:
    """A GridSim bundle: one the kit generates, or gridsim-v1 from the Hub (an env named gridsim, a day a task)."""

    name = "GridSim"

    def recognises(self, bundle: Path) -> bool:
        return (bundle / "envs" / ENV_NAME).is_dir() and (bundle / "evals" / "eval.toml").is_file()

    def picture(self, bundle: Path, split: str = "eval", index: int = 0):
        return plot_day(read_days(bundle, split)[index])

    def baselines(self, bundle: Path, split: str = "eval") -> dict[str, float]:
        return baseline_scores(read_days(bundle, split))

    def reference(self) -> tuple[str, dict[str, dict[int, float]]]:
        return "Qwen3-4B, gridsim-v1", REFERENCE

    def expert(self):
        return play_optimum


def play_optimum(act, task: dict) -> str:
    """The day's exact optimum: its prices, then the schedule ``battery.optimal_schedule`` makes of them."""
    prices = json.loads(act("get_prices", {}))
    act("submit_schedule", {"schedule": optimal_schedule(prices)})
    return DONE
