"""A run's progress as it goes: ``log_numbers`` reads a trainer's log as numbers (the live plot's rows, the health
check's), and ``clock``, ``done_line`` and ``Progress`` say how far a loop is, as "played 8 of 50 days · 0:42 · about
3:40 left" (``Progress``: a long loop outside a trainer, as ``rollout.play``; the live plot says its own).
"""

from __future__ import annotations

import math
import time
from numbers import Real

from transformers.utils.import_utils import is_in_notebook


def clock(seconds: float) -> str:
    """Seconds as a clock reads: "0:42", "12:05", "1:02:05"."""
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"


def done_line(what: str, done: int, total: int, elapsed: float, unit: str = "") -> str:
    """"<what> 4 of 8 <unit> · 0:05 · about 0:05 left": the time left from the pace so far, once something is done."""
    line = f"{what} {done} of {total}{f' {unit}' if unit else ''} · {clock(elapsed)}"
    if 0 < done < total:
        line += f" · about {clock(elapsed / done * (total - done))} left"
    return line


class Progress:
    """One line of done/total, time so far and time left, for a loop outside a trainer. In a notebook it is updated in
    place (a display handle, so the saved notebook keeps its last state); elsewhere printed at most every ``every``
    seconds, and at the end.

        progress = Progress("played", len(rows), "days")
        for done in ...: progress.update(done)      # "played 8 of 50 days · 0:42 · about 3:40 left"
    """

    def __init__(self, what: str, total: int, unit: str = "", every: float = 10.0):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.start, self._printed, self._handle = time.monotonic(), -math.inf, None
        self.notebook = is_in_notebook()

    def line(self, done: int) -> str:
        return done_line(self.what, done, self.total, time.monotonic() - self.start, self.unit)

    def update(self, done: int) -> None:
        text = {"text/plain": self.line(done)}
        if self.notebook:
            from IPython.display import display

            if self._handle is None:
                self._handle = display(text, raw=True, display_id=True)
            else:
                self._handle.update(text, raw=True)
        elif done >= self.total or time.monotonic() - self._printed >= self.every:
            print(text["text/plain"], flush=True)
            self._printed = time.monotonic()


def log_numbers(logs: dict) -> dict[str, float]:
    """The numeric entries of a log dict, None (TRL's all-NaN metric) as NaN."""
    return {k: math.nan if v is None else float(v) for k, v in logs.items()
            if v is None or (isinstance(v, Real) and not isinstance(v, bool))}
