"""Live view of a GRPO run: a ``TrainerCallback`` that plots in a notebook, or prints a line per log.

Like fastprogress, one interface with two flavours, picked by ``live_plot()``: under an IPython kernel with
ipywidgets it redraws a matplotlib figure in an ``ipywidgets.Output`` (reward ± std, zero-std groups, tool
calls and failures, eval reward, ``scores/*`` and ``eval_scores/*``, step time, GPU memory); elsewhere it
prints a compact line. Both keep every log event in ``.history`` (a DataFrame) so a notebook can assert on the run.

Usage::

    from agentenv_nb.notebook.live import live_plot

    live = live_plot()                       # or live_plot("console") / live_plot("notebook")
    trainer = GRPOTrainer(..., callbacks=[env.metrics, live])   # after ScoreLog, which adds scores/* to the log
    trainer.train()
    assert live.history["reward"].notna().any()

Key names are TRL 1.15 GRPOTrainer's (``reward``, ``reward_std``, ``frac_reward_zero_std``,
``tools/call_frequency``, ``tools/failure_frequency``, ``step_time``, ``rewards/<name>/mean``, and their
``eval_`` copies); any key may be missing.
"""

from __future__ import annotations

import importlib.util
import io
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


def _numbers(logs: dict) -> dict[str, float]:
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

    @property
    def history(self) -> pd.DataFrame:
        """Every log event so far, one row each, ``step`` first."""
        return pd.DataFrame(self.records)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is not None:
            self._step_times.append(time.perf_counter() - self._step_start)
            self._step_start = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = self.record(state.global_step, logs or {})
        self.show(row)

    def record(self, step: int, logs: dict) -> dict[str, float]:
        """Turn one log dict into a history row and keep it."""
        row = {"step": step, **_numbers(logs)}
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


class NotebookLivePlot(LivePlot):
    """Redraws one matplotlib figure inside an ``ipywidgets.Output``, at most once per ``min_interval`` seconds."""

    PANELS = [
        ("Reward", ["reward", "eval_reward"]),
        ("Groups with zero reward std", ["frac_reward_zero_std"]),
        ("Tool calls per rollout", ["tools/call_frequency", "tools/failure_frequency"]),
        ("Scores", []),  # ScoreLog's scores/<bundle>/<id>/mean and scores/<bundle>/unscored, and eval_ copies
        ("Step time (s)", ["step_time"]),
        ("GPU memory, peak (GiB)", ["gpu_allocated_gib", "gpu_reserved_gib"]),
    ]

    def __init__(self, min_interval: float = 1.0, width: float = 12.0):
        import ipywidgets
        from matplotlib.figure import Figure

        super().__init__()
        self.min_interval = min_interval
        self.output = ipywidgets.Output()
        self.figure = Figure(figsize=(width, 6))
        self._panels_drawn, self._lines, self._band = None, {}, None
        self._displayed = False
        self._last_draw = -math.inf

    def on_train_begin(self, args, state, control, **kwargs):
        self._display()

    def on_train_end(self, args, state, control, **kwargs):
        self.draw()

    def show(self, row):
        if time.monotonic() - self._last_draw >= self.min_interval:
            self.draw()

    def _display(self):
        from IPython.display import display

        display(self.output)
        self._displayed = True

    def _panels(self, df: pd.DataFrame) -> list[tuple[str, list[str]]]:
        """The panels that have data, each with its columns that have data."""
        scores = [c for c in df.columns if c.startswith(("scores/", "eval_scores/"))
                  and c.endswith(("/mean", "/unscored"))]
        panels = [(title, cols or scores) for title, cols in self.PANELS]
        return [(t, [c for c in cols if c in df and df[c].notna().any()]) for t, cols in panels
                if any(c in df and df[c].notna().any() for c in cols)]

    def _build(self, panels: list[tuple[str, list[str]]]) -> None:
        """One axes per panel, an empty line per column: redone only when the panels change, as axes are slow."""
        self.figure.clear()
        self._panels_drawn, self._lines, self._band = panels, {}, None
        if not panels:
            return
        axes = self.figure.subplots(2, math.ceil(len(panels) / 2), squeeze=False, gridspec_kw=dict(
            left=0.05, right=0.98, bottom=0.09, top=0.94, hspace=0.45, wspace=0.2)).flat
        for (title, cols), ax in zip(panels, axes):
            for col in cols:
                label = "reward ± reward_std" if col == "reward" else col
                (self._lines[col],) = ax.plot([], [], marker="o" if col.startswith("eval_") else ".", label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.legend(fontsize=7, loc="upper left")
        for ax in axes:  # the unused cell of an odd number of panels
            ax.set_visible(False)

    def draw(self) -> None:
        """Redraw the figure from the whole history now, ignoring the throttle."""
        from IPython.display import Image, display

        if not self._displayed:
            self._display()
        df = self.history
        if (panels := self._panels(df)) != self._panels_drawn:
            self._build(panels)
        for col, line in self._lines.items():
            data = df[["step", col]].dropna()
            line.set_data(data["step"], data[col])
            line.axes.relim()
        if "reward" in self._lines and "reward_std" in df:
            if self._band is not None:
                self._band.remove()
            band, reward = df[["step", "reward", "reward_std"]].dropna(), self._lines["reward"]
            self._band = reward.axes.fill_between(band["step"], band["reward"] - band["reward_std"],
                                                  band["reward"] + band["reward_std"], alpha=0.2,
                                                  color=reward.get_color())
        for line in self._lines.values():
            line.axes.autoscale_view()
        png = io.BytesIO()
        self.figure.savefig(png, format="png", dpi=80)
        with self.output:
            self.output.clear_output(wait=True)
            display(Image(png.getvalue()))
        self._last_draw = time.monotonic()


def in_notebook() -> bool:
    """True under an IPython kernel (Jupyter, Colab) with ipywidgets installed."""
    return is_in_notebook() and importlib.util.find_spec("ipywidgets") is not None


def live_plot(kind: str | None = None, **kwargs) -> LivePlot:
    """The live callback for where this runs; ``kind`` ("notebook" or "console") overrides the guess and
    ``kwargs`` go to the flavour (``min_interval``, ``width`` for the notebook)."""
    kind = kind or ("notebook" if in_notebook() else "console")
    flavours = {"notebook": NotebookLivePlot, "console": ConsoleLivePlot}
    if kind not in flavours:
        raise ValueError(f"kind must be one of {sorted(flavours)}, not {kind!r}")
    return flavours[kind](**kwargs)
