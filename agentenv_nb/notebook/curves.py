"""Eval curve of a run from its logs: eval reward by step, plotted against baselines and a reference table.

It reads what ``transformers.Trainer`` already writes (``trainer_state.json``'s ``log_history``), so it works
on a finished run, a checkpoint, or a live ``trainer.state.log_history``.

Usage::

    from agentenv_nb.notebook.curves import eval_curve, plot_eval_curve, save_eval_curve

    df = eval_curve("out")                   # output dir, checkpoint dir, trainer_state.json or log_history
    no_eval_loop("out")                      # an async run's: training steps and no eval (eval_curve says so)
    eval_table(df)                           # rounded, without the columns that repeat eval_reward
    baselines = {"before training": 0.12}     # notebook.views.baselines: an adapter's, else this
    plot_eval_curve(df, baselines=baselines)
    png, csv = save_eval_curve(df, "out", baselines=baselines, reference=("Qwen3-4B, my-bundle", {"TRL": {0: 0.5}}))
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from agentenv_nb.train.earlier_steps import trainer_states
from agentenv_nb.train.grpo.launch import ASYNC_EVALS

_EVAL_METRIC = re.compile(r"^eval_(reward|(scores|rewards)/.+/mean)$")


def find_trainer_state(path: str | Path) -> Path:
    """The ``trainer_state.json`` of ``path``: the file itself, or the furthest-trained of the directory's own
    and its ``checkpoint-*`` ones (the top-level one on a tie, as ``save_state`` writes it last)."""
    path = Path(path)
    if path.is_file():
        return path
    candidates = trainer_states(path)
    if not candidates:
        raise FileNotFoundError(f"no trainer_state.json in {path} or its checkpoint-* directories")
    return max(candidates, key=lambda p: json.loads(p.read_text()).get("global_step", 0))


def eval_curve(source: str | Path | list[dict]) -> pd.DataFrame:
    """Eval reward by step, plus any ``eval_scores/<id>/mean`` and ``eval_rewards/<name>/mean`` columns.

    ``source`` is a run's output or checkpoint directory, a ``trainer_state.json``, or a ``log_history`` list.
    ``eval_reward`` falls back to the mean of ``eval_rewards/*/mean`` when TRL logged only those.
    """
    source = log_history(source)
    if no_eval_loop(source):
        print(f"agentenv_nb: the run logged training steps and no eval: {ASYNC_EVALS}")
    rows = [{"step": log["step"], "eval_reward": None, **{k: v for k, v in log.items() if _EVAL_METRIC.match(k)}}
            for log in source if any(_EVAL_METRIC.match(k) for k in log)]
    df = (pd.DataFrame(rows) if rows else pd.DataFrame(columns=["step", "eval_reward"])).astype(float)
    per_env = [c for c in df.columns if c.startswith("eval_rewards/")]
    if per_env:
        df["eval_reward"] = df["eval_reward"].fillna(df[per_env].mean(axis=1))
    return df.astype({"step": int})


def log_history(source: str | Path | list[dict]) -> list[dict]:
    """The ``log_history`` of a run's output or checkpoint directory or ``trainer_state.json``, or ``source`` itself."""
    return source if isinstance(source, list) else json.loads(find_trainer_state(source).read_text())["log_history"]


def no_eval_loop(source: str | Path | list[dict]) -> bool:
    """Whether the run trained without an eval loop, as the async trainer does (notebook 03's TRAINER="async"): it
    logged training steps and no eval."""
    logs = log_history(source)
    return any("loss" in log for log in logs) and not any(_EVAL_METRIC.match(key) for log in logs for key in log)


def repeats_reward(df: pd.DataFrame, column: str) -> bool:
    """Whether ``column`` is ``eval_reward`` again (a task with one score, or one env), to float rounding."""
    return column != "eval_reward" and np.allclose(df[column], df["eval_reward"], rtol=0, atol=1e-6, equal_nan=True)


def eval_table(df: pd.DataFrame, decimals: int = 3) -> pd.DataFrame:
    """``df`` as a person reads it: rounded, and without the columns that only repeat ``eval_reward``."""
    return df.drop(columns=[c for c in df.columns if c != "step" and repeats_reward(df, c)]).round(decimals)


def plot_eval_curve(df: pd.DataFrame, baselines: dict[str, float] | None = None,
                    reference: tuple[str, dict[str, dict[int, float]]] | None = None,
                    ax: Axes | None = None, title: str = "Eval reward by step") -> Figure:
    """Plot ``df``'s eval reward (and ``eval_scores/<id>/mean``) by step, with each baseline a horizontal line and
    each run of ``reference`` (what they trained on, and each run's eval reward by step, as a task adapter's
    ``reference()`` gives them) a faint dashed line.

    Baselines are what ``notebook.views.baselines`` gives: a task adapter's, e.g. GridSim's ``{"idle": 0.2,
    "greedy": 0.76, "optimum": 1.0}``, else the eval reward before training.
    """
    trained, reference = reference or ("", {})
    if ax is None:
        ax = Figure(figsize=(10, 4.5), layout="constrained").subplots()
    for name, by_step in reference.items():
        ax.plot(list(by_step), list(by_step.values()), linestyle="--", marker=".", alpha=0.35,
                label=f"{name} ({trained})")
    for name, value in (baselines or {}).items():
        ax.axhline(value, color="grey", linewidth=1, linestyle=":")
        ax.annotate(f"{name} {value:.2f}", (1, value), xycoords=("axes fraction", "data"), ha="right",
                    va="bottom", fontsize=8, color="grey")
    # A score that repeats the reward (a task with one score) would hide under the run's own line
    scores = [c for c in df.columns if c.startswith("eval_scores/") and not repeats_reward(df, c)]
    for col in scores:
        ax.plot(df["step"], df[col], marker="o", linewidth=1, label=col)
    ax.plot(df["step"], df["eval_reward"], marker="o", color="black", linewidth=2.5, zorder=3, label="eval_reward")
    cut = None
    if len(df) and reference:  # the reference runs 40 steps: a shorter run gets the width, they are cut at its end
        last = max(int(df["step"].max()), 1)
        ax.set_xlim(-0.05 * last, 1.05 * last)
        longest = max(max(by_step) for by_step in reference.values())
        cut = f"reference runs: {longest} steps, cut at this run's step {last}" if last < longest else None
    # a flat curve (the tiny model's zeros) on matplotlib's own ±0.04 axis reads as noise: show the reward's 0 to 1
    shown = [*df["eval_reward"].dropna(), *(baselines or {}).values()]
    if shown and max(shown) - min(shown) < 0.05:
        ax.set_ylim(min(-0.05, min(shown) - 0.05), max(1.05, max(shown) + 0.05))
    ax.set(xlabel="GRPO step", ylabel="eval reward", title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), title=cut,
              title_fontsize=8)  # beside the axes, off the data
    return ax.figure


def save_eval_curve(df: pd.DataFrame, out_dir: str | Path, name: str = "eval_curve",
                    **plot_kwargs) -> tuple[Path, Path]:
    """Write ``<name>.png`` (``plot_eval_curve(df, **plot_kwargs)``) and ``<name>.csv`` to ``out_dir``;
    return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, csv = out_dir / f"{name}.png", out_dir / f"{name}.csv"
    plot_eval_curve(df, **plot_kwargs).savefig(png, dpi=100)
    df.to_csv(csv, index=False)
    return png, csv
