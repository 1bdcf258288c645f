"""The live view's shared base: each log event of a trainer as a row of ``.history``, and its console flavour.

``LivePlot`` records rows (reward fallbacks, step time, GPU memory) and how far an eval has got, and leaves showing
them to a flavour; ``ConsoleLivePlot`` prints a compact line a row (``format_row``), for scripts and CI logs, as the
training command does on its main process. The notebook flavour, and ``live_plot()`` which picks one, are in
``agentenv_nb.notebook.live``. ``Progress`` is the line a long loop outside a trainer shows (``rollout.play``).

    from agentenv_nb.train.progress import ConsoleLivePlot

    live = ConsoleLivePlot()
    trainer = GRPOTrainer(..., callbacks=[env.metrics, live])   # after ScoreLog, which adds scores/* to the log
    trainer.train()
    live.history                                                # a DataFrame, a row a log event
"""

from __future__ import annotations

import math
import time
from numbers import Real

import pandas as pd
import torch

from agentenv_nb.stack import hide_broken_torchvision

hide_broken_torchvision()  # else a broken torchvision wheel breaks the import of TrainerCallback (see stack.py)
from transformers import TrainerCallback  # noqa: E402
from transformers.utils.import_utils import is_in_notebook  # noqa: E402

_GIB = 2**30


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


def _mean_of(row: dict[str, float], prefix: str, suffix: str = "/mean") -> float | None:
    """Mean over keys ``<prefix><name><suffix>``: the reward when TRL logs only ``rewards/<env>/mean``."""
    values = [v for k, v in row.items() if k.startswith(prefix) and k.endswith(suffix) and not math.isnan(v)]
    return sum(values) / len(values) if values else None


class LivePlot(TrainerCallback):
    """Records each log event as a row of ``.history``, adding reward fallbacks, step time and GPU memory.

    Subclasses say how a row is shown (``show``); this base shows nothing.
    """

    def __init__(self):
        self.records: list[dict[str, float]] = []
        self._step_start: float | None = None
        self._step_times: list[float] = []
        self.evaluating = ""  # "eval batch 2 of 7 · 0:40 · about 1:40 left" while an eval runs, else ""
        self._eval: tuple[float, int] | None = None  # (start time, batches done) of the eval running

    @property
    def history(self) -> pd.DataFrame:
        """Every log event so far, one row each, ``step`` first."""
        return pd.DataFrame(self.records)

    def by_step(self) -> pd.DataFrame:
        """One row per step, its train and eval logs merged; the run's closing summary (``train_runtime``) left out."""
        df = self.history
        if "train_runtime" in df:
            df = df[df["train_runtime"].isna()].drop(columns=[c for c in df if c.startswith("train_")])
        return df.groupby("step", as_index=False).first() if len(df) else df

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.records:  # a resumed or finished run: its logs so far, from the checkpoint's state
            for logs in state.log_history:
                self.record(logs.get("step", state.global_step), logs)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is not None:
            self._step_times.append(time.perf_counter() - self._step_start)
            self._step_start = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = self.record(state.global_step, logs or {})
        self.show(row)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        start, done = self._eval or (time.monotonic(), 0)
        self._eval = (start, done + 1)
        total = len(eval_dataloader) if eval_dataloader is not None and hasattr(eval_dataloader, "__len__") else 0
        self.evaluating = done_line("eval batch", done + 1, max(total, done + 1), time.monotonic() - start)
        self.show_eval()

    def on_evaluate(self, args, state, control, **kwargs):
        self._eval, self.evaluating = None, ""

    def record(self, step: int, logs: dict) -> dict[str, float]:
        """Turn one log dict into a history row and keep it."""
        row = {"step": step, **log_numbers(logs)}
        if "reward" not in row and (reward := _mean_of(row, "rewards/")) is not None:
            row["reward"] = reward
        if "eval_reward" not in row and (reward := _mean_of(row, "eval_rewards/")) is not None:
            row["eval_reward"] = reward
        if "loss" in row:  # a training log: it gets the steps timed since the last one
            if "step_time" not in row and self._step_times:
                row["step_time"] = sum(self._step_times) / len(self._step_times)
            self._step_times.clear()
        if torch.cuda.is_available():
            row["gpu_allocated_gib"] = torch.cuda.max_memory_allocated() / _GIB
            row["gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / _GIB
        self.records.append(row)
        return row

    def show(self, row: dict[str, float]) -> None:
        """Display one new row; the flavours override this."""

    def show_eval(self) -> None:
        """Display how far the running eval has got (``evaluating``); the flavours override this."""


def format_row(row: dict[str, float]) -> str:
    """One compact line for a history row: only the fields it has."""
    def has(key):
        return key in row and not math.isnan(row[key])

    parts = [f"step {row['step']:>4}"]
    if has("loss"):
        parts.append(f"loss {row['loss']:.4f}")
    if has("reward"):
        parts.append(f"reward {row['reward']:.3f}" + (f" ± {row['reward_std']:.3f}" if has("reward_std") else ""))
    if has("frac_reward_zero_std"):
        parts.append(f"zero-std {row['frac_reward_zero_std']:.2f}")
    if has("tools/call_frequency"):
        fails = f", {row['tools/failure_frequency']:.2f} failed" if has("tools/failure_frequency") else ""
        parts.append(f"tools {row['tools/call_frequency']:.2f}/rollout{fails}")
    if has("eval_reward"):
        parts.append(f"eval reward {row['eval_reward']:.3f}")
    if has("step_time"):
        parts.append(f"{row['step_time']:.4g} s/step")
    if has("train_runtime"):
        parts.append(f"run {row['train_runtime']:.0f} s")
    if has("gpu_allocated_gib"):
        parts.append(f"GPU {row['gpu_allocated_gib']:.1f}/{row['gpu_reserved_gib']:.1f} GiB")
    return " | ".join(parts)


class ConsoleLivePlot(LivePlot):
    """Prints one line per log event (``format_row``): for scripts, CI logs and plain terminals."""

    def show(self, row):
        print(format_row(row), flush=True)

    def show_eval(self):
        print(self.evaluating, flush=True)
