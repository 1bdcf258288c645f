"""Notebook parameters from the environment: a notebook's parameters cell sets its defaults, and
``AGENTENV_NB_<NAME>`` overrides any of them, so CI and the README's demo run the same notebooks on the tiny
bundle and model without editing them.

    BUNDLE = "gridsim-v1"
    globals().update(from_env(globals()))   # AGENTENV_NB_BUNDLE=gridsim-tiny makes BUNDLE "gridsim-tiny"
    run = from_env(GRPORun())               # notebook 03's: AGENTENV_NB_MAX_STEPS=2 makes run.max_steps 2
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from agentenv_nb.settings import PREFIX
from agentenv_nb.train.grpo.run import GRPORun


def from_env(defaults: dict[str, Any] | GRPORun) -> dict[str, Any] | GRPORun:
    """What the environment overrides: of a notebook's ``globals()``, the UPPER_CASE names ``AGENTENV_NB_<NAME>``
    sets, each as its default's type; of a ``GRPORun``, a copy with them."""
    if isinstance(defaults, GRPORun):
        found = _overrides(defaults.parameters(), GRPORun.kind)
        return dataclasses.replace(defaults, **{name.lower(): value for name, value in found.items()})
    return _overrides(defaults, lambda name: type(defaults[name]))


def _overrides(defaults: dict[str, Any], kind: Callable[[str], type]) -> dict[str, Any]:
    found = {}
    for name in defaults:
        if not name.isupper() or (PREFIX + name) not in os.environ:
            continue
        text, wanted = os.environ[PREFIX + name], kind(name)
        if wanted is bool:
            found[name] = text.lower() in ("1", "true", "yes", "on")
        elif wanted in (int, float):
            found[name] = wanted(text)
        else:
            found[name] = text
    for name, value in found.items():
        print(f"{name} = {value!r}  (from {PREFIX}{name})")
    return found


TINY_RUN = GRPORun(bundle="gridsim-tiny", preset="cpu-tiny", sandbox="process", save_steps=2,
                   server_processes=0, eval_days=8, max_new_tokens=160)
"""Notebook 03's tiny run: the tiny bundle and model on CPU, the preset's 4 steps, the envs on a thread."""
TINY = {**{name: str(value) for name, value in TINY_RUN.changed().items()}, "MODEL": "tiny",
        "DISTILL_ROUNDS": "1", "DISTILL_STEPS": "20"}


def use_tiny_defaults(run_dir: str | os.PathLike) -> None:
    """Point every notebook at the tiny bundle and model on CPU, writing under ``run_dir``, unless the
    environment already says otherwise: what CI and the README's demo run."""
    run_dir = os.fspath(run_dir)
    for name, value in {**TINY, "RUN_DIR": run_dir, "BUNDLES_DIR": os.path.join(run_dir, "bundles"),
                        "LIBRARY_LOG": os.path.join(run_dir, "agentenv_nb.log")}.items():
        os.environ.setdefault(PREFIX + name, value)
    # The env framework's store of episodes (agent_env's SQLite under $XDG_STATE_HOME/agent-env) kept with the run, as
    # on a fresh machine: the machine's own store holds every episode ever played here, and lookups slow as it grows.
    os.environ.setdefault("XDG_STATE_HOME", os.path.join(os.path.abspath(run_dir), "state"))
