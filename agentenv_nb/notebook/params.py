"""Notebook parameters from the environment: a notebook's parameters cell sets its defaults, and
``AGENTENV_NB_<NAME>`` overrides any of them, so CI and the README's demo run the same notebooks on the tiny
bundle and model without editing them.

    BUNDLE = "gridsim-v1"
    MAX_STEPS = 40
    globals().update(from_env(globals()))   # AGENTENV_NB_MAX_STEPS=2 makes MAX_STEPS 2
"""

from __future__ import annotations

import os
from typing import Any

from agentenv_nb.settings import PREFIX


def from_env(defaults: dict[str, Any]) -> dict[str, Any]:
    """The UPPER_CASE names of ``defaults`` that the environment overrides, each as its default's type."""
    found = {}
    for name, default in defaults.items():
        if not name.isupper() or (PREFIX + name) not in os.environ:
            continue
        text = os.environ[PREFIX + name]
        if isinstance(default, bool):
            found[name] = text.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, (int, float)):
            found[name] = type(default)(text)
        else:
            found[name] = text
    for name, value in found.items():
        print(f"{name} = {value!r}  (from {PREFIX}{name})")
    return found


TINY = {"BUNDLE": "gridsim-tiny", "MODEL": "tiny", "PRESET": "cpu-tiny", "SANDBOX": "process", "EVAL_DAYS": "8",
        "MAX_NEW_TOKENS": "160", "DISTILL_ROUNDS": "1", "DISTILL_STEPS": "20", "MAX_STEPS": "4", "SAVE_STEPS": "2",
        "SERVER_PROCESSES": "0"}


def use_tiny_defaults(run_dir: str | os.PathLike) -> None:
    """Point every notebook at the tiny bundle and model on CPU, writing under ``run_dir``, unless the
    environment already says otherwise: what CI and the README's demo run."""
    run_dir = os.fspath(run_dir)
    for name, value in {**TINY, "RUN_DIR": run_dir, "BUNDLES_DIR": os.path.join(run_dir, "bundles")}.items():
        os.environ.setdefault(PREFIX + name, value)
    # The env framework's store of episodes (agent_env's SQLite under $XDG_STATE_HOME/agent-env) kept with the run, as
    # on a fresh machine: the machine's own store holds every episode ever played here, and lookups slow as it grows.
    os.environ.setdefault("XDG_STATE_HOME", os.path.join(os.path.abspath(run_dir), "state"))
