"""What a notebook needs the ones before it to have left, checked before it loads anything: notebook 03 (and the
training command) the warm start notebook 02 saves, notebook 04 the logs of notebook 03's GRPO run.

    warm_start_problem("runs/desk", "")       # None, or one line: which notebook to run, or what to set instead
    need_warm_start("runs/desk", "")          # the model to train; else Stop with that line
    need_grpo_logs("runs/desk")               # the trainer_state.json files of RUN_DIR/grpo; else Stop
"""

from __future__ import annotations

import re
from pathlib import Path

from agentenv_nb.stops import Stop
from agentenv_nb.train.naming import NOTEBOOK, Naming


def looks_like_hub_id(name: str | None) -> bool:
    """Whether ``name`` reads as a Hub id (owner/name) and isn't a path here."""
    return bool(name) and not name.startswith(".") and not Path(name).exists() and \
        re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None


def warm_start(run_dir: str | Path, given: str = "") -> str:
    """The model GRPO starts from: ``given`` (a folder or a Hub id), else the one notebook 02 saves in
    RUN_DIR/sft/merged."""
    return given or f"{run_dir}/sft/merged"


def warm_start_problem(run_dir: str | Path, given: str = "", naming: Naming = NOTEBOOK) -> str | None:
    """None where the warm start is there (a folder, or a Hub id given); else one line saying what to do, in
    ``naming``'s words (the notebook's WARM_START, the command's --warm-start)."""
    name = warm_start(run_dir, given)
    if Path(name).is_dir() or (given and looks_like_hub_id(name)):
        return None
    if not given:
        return (f"no warm start at {name}: run notebook 02 with RUN_DIR={run_dir} first (it saves the model there), "
                f"or {naming.set_to('warm_start')} a model folder or Hub id")
    return f"{naming.given('warm_start', name)}: no such folder, and not a Hub id (owner/name)"


def need_warm_start(run_dir: str | Path, given: str = "") -> str:
    """The warm start to train (``warm_start``), said in a line; Stop with ``warm_start_problem``'s line where there
    is none."""
    if problem := warm_start_problem(run_dir, given):
        raise Stop(problem)
    name = warm_start(run_dir, given)
    print(f"GRPO trains from {name}" + ("" if given else ", the warm start notebook 02 saved"))
    return name


def trainer_states(grpo_dir: str | Path) -> list[Path]:
    """The ``trainer_state.json`` files a GRPO run wrote in ``grpo_dir``: its own and its checkpoints'."""
    grpo_dir = Path(grpo_dir)
    return [path for path in [grpo_dir / "trainer_state.json", *grpo_dir.glob("checkpoint-*/trainer_state.json")]
            if path.is_file()]


def need_grpo_logs(run_dir: str | Path) -> list[Path]:
    """The logs notebook 03's GRPO run left in RUN_DIR/grpo; Stop saying to run it where there are none."""
    if found := trainer_states(Path(run_dir) / "grpo"):
        return found
    raise Stop(f"no GRPO run in {run_dir}/grpo (no trainer_state.json there): run notebook 03 with RUN_DIR={run_dir} "
               "first")
