"""Where a run's metrics go besides the notebook: transformers' own ``report_to`` integrations (TensorBoard, trackio,
Weights & Biases), which log what the trainer logs, the task's scores (``ScoreLog``) included.

    problem = report_to_problem("tensorboard")   # None, or one line saying what to install or pick
    fit(trainer, report_to="tensorboard")          # agentenv_nb.train.fit adds the integration to a built trainer
    # tensorboard --logdir runs/gridsim/grpo/runs: train/reward, train/scores/<bundle>/<id>/mean, eval/... by step

TensorBoard writes event files under ``<output_dir>/runs/`` (``TENSORBOARD_LOGGING_DIR`` moves them); trackio keeps
a local store (``trackio show``) unless told to sync a Space; W&B needs a login (``wandb login``) or
``WANDB_MODE=offline``.
"""

from __future__ import annotations

import importlib.util

from agentenv_nb.train.naming import NOTEBOOK, Naming

REPORT_TO = {"none": None, "tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
"""The choices, each with the package it needs (requirements-gpu.txt pins tensorboard; the others install apart)."""


def report_to_problem(report_to: str, naming: Naming = NOTEBOOK) -> str | None:
    """None where ``report_to`` can log here; else one line saying what to pick or install, in ``naming``'s words."""
    given = naming.given("report_to", repr(report_to))
    if report_to not in REPORT_TO:
        return f"{given} is not one of {', '.join(map(repr, REPORT_TO))}"
    package = REPORT_TO[report_to]
    if package and importlib.util.find_spec(package) is None:
        return f"{given} needs the {package} package: pip install {package}, or pick 'none'"
    return None


def track(trainer, report_to: str) -> None:
    """Add ``report_to``'s integration to a built trainer (as its config's ``report_to`` would have); raises
    ValueError with ``report_to_problem``'s line where it can't log."""
    if problem := report_to_problem(report_to):
        raise ValueError(problem)
    if report_to == "none":
        return
    from transformers.integrations import get_reporting_integration_callbacks

    callbacks = trainer.callback_handler.callbacks
    for callback in get_reporting_integration_callbacks([report_to]):
        if not any(isinstance(present, callback) for present in callbacks):
            trainer.add_callback(callback)
    trainer.args.report_to = sorted({*trainer.args.report_to, report_to} - {"none"})
