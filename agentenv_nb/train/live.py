"""Live view of a GRPO run: a ``TrainerCallback`` that plots in a notebook, or prints a line per log.

Like fastprogress, one interface with two flavours, picked by ``live_plot()``: under an IPython kernel it redraws a
matplotlib figure under a progress line (reward ± std, zero-std groups, tool calls and failures, eval reward,
``scores/*`` and ``eval_scores/*``, step time, GPU memory; the loss where nothing is rewarded, as in SFT); elsewhere it
prints a compact line. Both keep every log event in ``.history`` (a DataFrame) so a notebook can assert on the run,
and ``by_step()`` merges a step's train and eval logs into one row.

While training, JupyterLab shows the figure in an ``ipywidgets.Output``; Colab, whose widget support varies with the
ipywidgets version (googlecolab/colabtools#3020), gets a display handle updated in place. At the end the figure
replaces the widget as a plain PNG output: JupyterLab saves no widget state, so a widget would reopen as "model not
found", and nbconvert and GitHub show a widget as "Output()".

Usage::

    from agentenv_nb.train.live import live_plot

    live = live_plot()                       # or live_plot("console") / live_plot("notebook")
    trainer = GRPOTrainer(..., callbacks=[env.metrics, live])   # after ScoreLog, which adds scores/* to the log
    fit(trainer)                             # agentenv_nb.train.fit: resumes, and says so
    assert live.history["reward"].notna().any()

Key names are TRL 1.15 GRPOTrainer's (``reward``, ``reward_std``, ``frac_reward_zero_std``,
``tools/call_frequency``, ``tools/failure_frequency``, ``step_time``, ``rewards/<name>/mean``, and their
``eval_`` copies); any key may be missing. The training command (``python -m agentenv_nb.train``) shows the console
flavour.
"""

from __future__ import annotations

import importlib.util
import io
import math
import sys
import time

import pandas as pd
import torch

from agentenv_nb.stack import hide_broken_torchvision
from agentenv_nb.train.progress import clock, done_line, log_numbers

hide_broken_torchvision()  # else a broken torchvision wheel breaks the import of TrainerCallback (see stack.py)
from transformers import TrainerCallback  # noqa: E402
from transformers.utils.import_utils import is_in_notebook  # noqa: E402

_GIB = 2**30


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


class NotebookLivePlot(LivePlot):
    """Redraws one matplotlib figure, at most once per ``min_interval`` seconds, under a progress line; in an
    ``ipywidgets.Output`` where widgets render (``widget=True``, the default but on Colab), else in a display handle.
    At the end the figure replaces both as a plain PNG output, which every viewer shows."""

    PANELS = [  # (title, y label, columns)
        ("Reward", "mean reward", ["reward", "eval_reward"]),
        ("Groups with zero reward std", "share of groups", ["frac_reward_zero_std"]),
        ("Tool calls per rollout", "calls per rollout", ["tools/call_frequency", "tools/failure_frequency"]),
        ("Scores", "mean score", []),  # ScoreLog's scores/<bundle>/<id>/mean and scores/<bundle>/unscored, eval_ too
        ("Step time (s)", "seconds", ["step_time"]),
        ("GPU memory, peak (GiB)", "GiB", ["gpu_allocated_gib", "gpu_reserved_gib"]),
    ]
    UNREWARDED = [("Training loss", "loss", ["loss"]), ("Token accuracy", "accuracy", ["mean_token_accuracy"])]  # SFT
    LABELS = {"reward": "train, ± std", "eval_reward": "eval", "tools/call_frequency": "calls",
              "tools/failure_frequency": "failed calls", "gpu_allocated_gib": "allocated",
              "gpu_reserved_gib": "reserved"}
    shows_progress = True  # agentenv_nb.train.fit leaves transformers' own progress table out

    def __init__(self, min_interval: float = 1.0, width: float = 12.0, widget: bool | None = None,
                 baselines: dict[str, float] | None = None):
        from matplotlib.figure import Figure

        super().__init__()
        self.min_interval, self.width = min_interval, width
        self.baselines = baselines or {}  # drawn across the Reward panel, e.g. gridsim.baseline_scores(eval days)
        if widget is None:
            widget = importlib.util.find_spec("ipywidgets") is not None and not in_colab()
        if widget:
            import ipywidgets
        # datasets' map bars (a trainer tokenizing its data) are widgets too, which a saved notebook reopens as errors
        import datasets

        datasets.disable_progress_bars()
        self.output = ipywidgets.Output() if widget else None
        self.figure = Figure(figsize=(width, 7))
        self._panels_drawn, self._lines, self._band = None, {}, None
        self._handle = None
        self._last_draw = -math.inf
        self.progress = ""
        self._clock: tuple[float, int] | None = None  # (start time, first step) of this train() call
        self._steps = ""  # the progress line's step part, to which a running eval's is added

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self._clock = (time.monotonic(), state.global_step)
        self._track(state)
        self.draw()

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        self._track(state)

    def on_train_end(self, args, state, control, **kwargs):
        self._track(state, finished=True)
        self.draw(final=True)

    def show(self, row):
        self.progress = self._steps
        if time.monotonic() - self._last_draw >= self.min_interval:
            self.draw()

    def show_eval(self):
        self.progress = f"{self._steps} · {self.evaluating}" if self._steps else self.evaluating
        if time.monotonic() - self._last_draw >= self.min_interval:
            self.draw()

    def _track(self, state, finished: bool = False) -> None:
        """The progress line: running or finished (a notebook's status bar may say "Idle" while a trainer runs: the
        widget stack's, not the kit's), step of max_steps, time so far and, from the steps this call trained, time
        left."""
        start, first = self._clock or (time.monotonic(), state.global_step)
        elapsed, done = time.monotonic() - start, state.global_step - first
        line = (f"{'finished' if finished else 'running'} · step {state.global_step} of {state.max_steps} · "
                f"{clock(elapsed)}")
        if 0 < done and state.global_step < state.max_steps:
            line += f" · about {clock(elapsed / done * (state.max_steps - state.global_step))} left"
        self.progress = self._steps = line

    def _panels(self, df: pd.DataFrame) -> list[tuple[str, str, list[str]]]:
        """The panels that have data, each with its columns that have data."""
        scores = [c for c in df.columns if c.startswith(("scores/", "eval_scores/"))
                  and c.endswith(("/mean", "/unscored"))]
        rewarded = any(c in df and df[c].notna().any() for c in ("reward", "eval_reward"))
        panels = [(title, y, cols or scores) for title, y, cols in (self.PANELS if rewarded else self.UNREWARDED)]
        return [(t, y, [c for c in cols if c in df and df[c].notna().any()]) for t, y, cols in panels
                if any(c in df and df[c].notna().any() for c in cols)]

    def label(self, column: str) -> str:
        """A legend entry a person reads: "eval", "calls", "<score id>", "<score id> (eval)", "unscored"."""
        if column in self.LABELS:
            return self.LABELS[column]
        if column.startswith(("scores/", "eval_scores/")):
            name = column.split("/")[-2] if column.endswith("/mean") else "unscored"
            return f"{name} (eval)" if column.startswith("eval_") else name
        return column

    def _build(self, panels: list[tuple[str, str, list[str]]]) -> None:
        """One axes per panel, an empty line per column: redone only when the panels change, as axes are slow. With
        nothing to plot yet (the eval before the first step) the figure is only its progress line."""
        from matplotlib.ticker import MaxNLocator

        self.figure.clear()
        rows = min(2, len(panels))  # one panel (SFT's loss alone) fills one row, not the top half of two
        self.figure.set_size_inches(self.width, 3.5 * rows if panels else 0.45)
        self._panels_drawn, self._lines, self._band = panels, {}, None
        if not panels:
            return
        margins = dict(bottom=0.17, top=0.9) if rows == 2 else dict(bottom=0.2, top=0.8)  # the same inches either way
        axes = self.figure.subplots(rows, math.ceil(len(panels) / rows), squeeze=False, gridspec_kw=dict(
            left=0.06, right=0.98, hspace=0.8, wspace=0.28, **margins)).flat
        for (title, ylabel, cols), ax in zip(panels, axes):
            for col in cols:
                (self._lines[col],) = ax.plot([], [], marker="o" if col.startswith("eval_") else ".",
                                              label=self.label(col))
            if title == "Reward":
                for name, value in self.baselines.items():
                    ax.axhline(value, color="grey", linewidth=1, linestyle=":")
                    ax.annotate(f"{name} {value:.2f}", (1, value), xycoords=("axes fraction", "data"), ha="right",
                                va="bottom", fontsize=8, color="grey")
            ax.set_title(title, fontsize=10)
            ax.set(xlabel="step", ylabel=ylabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            if len(cols) > 1:  # under the axes, off the data
                ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, frameon=False)
        for ax in axes:  # the unused cell of an odd number of panels
            ax.set_visible(False)

    def draw(self, final: bool = False) -> None:
        """Redraw the figure from the whole history now, ignoring the throttle; ``final`` leaves it as a PNG output."""
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
        self.figure.suptitle(self.progress, x=0.05 if panels else 0.01, y=0.98 if panels else 0.75, ha="left",
                             fontsize=11)
        png = io.BytesIO()
        self.figure.savefig(png, format="png", dpi=80)
        self._show(png.getvalue(), final)
        self._last_draw = time.monotonic()

    def _show(self, png: bytes, final: bool) -> None:
        from IPython.display import Image, display

        image = Image(png)
        if self.output is None or final:
            if self._handle is None:
                self._handle = display(image, display_id=True)
            else:
                self._handle.update(image)  # in place of the widget too: the PNG is what a saved notebook keeps
            if final and self.output is not None:
                self.output.close()
            return
        if self._handle is None:
            self._handle = display(self.output, display_id=True)
        with self.output:
            self.output.clear_output(wait=True)
            display(image)


def in_colab() -> bool:
    """True in a Colab kernel, where the plot updates a display handle rather than a widget."""
    return "google.colab" in sys.modules


def in_notebook() -> bool:
    """True under an IPython kernel (Jupyter, Colab)."""
    return is_in_notebook()


def live_plot(kind: str | None = None, **kwargs) -> LivePlot:
    """The live callback for where this runs; ``kind`` ("notebook" or "console") overrides the guess and
    ``kwargs`` go to the flavour (``min_interval``, ``width``, ``widget`` for the notebook)."""
    kind = kind or ("notebook" if in_notebook() else "console")
    flavours = {"notebook": NotebookLivePlot, "console": ConsoleLivePlot}
    if kind not in flavours:
        raise ValueError(f"kind must be one of {sorted(flavours)}, not {kind!r}")
    return flavours[kind](**kwargs)
