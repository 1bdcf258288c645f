"""Notebook parameters from the environment: a notebook's parameters cell sets its defaults, and
``AGENTENV_NB_<NAME>`` overrides any of them, so CI and the README's demo run the same notebooks on the tiny
bundle and model without editing them.

    BUNDLE = "gridsim-v1"
    MAX_STEPS = None
    globals().update(from_env(globals(), GRPORun.kind))   # AGENTENV_NB_MAX_STEPS=2 makes MAX_STEPS 2

Each value is read as the kit's settings are (``settings.parse_as``): a value that doesn't parse stops the cell with
one line naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from agentenv_nb.settings import PREFIX, parse_as
from agentenv_nb.train.grpo.run import GRPORun


def from_env(defaults: dict[str, Any], kinds: Callable[[str], type] | None = None) -> dict[str, Any]:
    """Of a notebook's ``globals()``, the UPPER_CASE names ``AGENTENV_NB_<NAME>`` sets, each read as its default's
    type, or as ``kinds(name)`` says where the default is None (notebook 03's: ``GRPORun.kind``)."""
    found = {}
    for name, default in defaults.items():
        variable = PREFIX + name
        if not name.isupper() or variable not in os.environ:
            continue
        kind = type(default) if default is not None or kinds is None else kinds(name)
        found[name] = parse_as(kind, os.environ[variable].strip(), variable, f"the notebook's {name}")
    for name, value in found.items():
        print(f"{name} = {value!r}  (from {PREFIX}{name})")
    return found


TINY_RUN = GRPORun(bundle="gridsim-tiny", preset="cpu-tiny", sandbox="process", save_steps=2,
                   server_processes=0, eval_days=8, max_new_tokens=160)
"""Notebook 03's tiny run: the tiny bundle and model on CPU, the preset's 4 steps, the envs on a thread."""
TINY = {**{name: str(value) for name, value in TINY_RUN.changed().items()}, "MODEL": "tiny",
        "DISTILL_ROUNDS": "1", "DISTILL_STEPS": "20"}


QUICK = {"DISTILL_STEPS": "5", "MAX_STEPS": "2", "EVAL_DAYS": "4"}
"""The tiny run in fewer steps, for the tests that run the notebooks to check each cell and what a person sees, not
what the model learns. Its SFT keeps the tiny defaults' 200 steps: after 100, the tiny model called no tool in a
GRPO step on some bundles."""


def use_tiny_defaults(run_dir: str | os.PathLike, quick: bool = False) -> None:
    """Point every notebook at the tiny bundle and model on CPU, writing under ``run_dir``, unless the
    environment already says otherwise: what CI (``quick``: in the fewer steps of ``QUICK``) and the README's demo
    run."""
    run_dir = os.fspath(run_dir)
    for name, value in {**TINY, **(QUICK if quick else {}), "RUN_DIR": run_dir,
                        "BUNDLES_DIR": os.path.join(run_dir, "bundles"),
                        "LIBRARY_LOG": os.path.join(run_dir, "agentenv_nb.log")}.items():
        os.environ.setdefault(PREFIX + name, value)
    # The env framework's store of episodes (agent_env's SQLite under $XDG_STATE_HOME/agent-env) kept with the run, as
    # on a fresh machine: the machine's own store holds every episode ever played here, and lookups slow as it grows.
    os.environ.setdefault("XDG_STATE_HOME", os.path.join(os.path.abspath(run_dir), "state"))
