"""Task adapters: what a bundle may offer beyond its tasks, behind one small interface. GridSim's is the kit's own
(its exact optimum as the expert, its baselines, a day's prices, the recipe page's table); a package adds one for its
bundle under the entry-point group ``agentenv_nb.task_adapters``. Every notebook works without one.

    adapter = adapter_for(bundle)       # the first adapter that recognises the folder, else None
    if adapter:
        adapter.baselines(bundle)       # {"idle": 0.2, ...}: lines the reward is read against
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ENTRY_POINTS = "agentenv_nb.task_adapters"
Expert = Callable[[Callable[[str, dict], str], dict], str]  # expert(act, task) -> the reply that ends its turn


class TaskAdapter:
    """The extras of one kind of bundle. ``recognises`` is required; each other method returns None where the
    bundle has no such thing, as the base class's do, so a subclass implements only what it has (GridSim's, which
    has all, implements each without subclassing)."""

    name = "task adapter"

    def recognises(self, bundle: Path) -> bool:
        """Whether ``bundle`` (a folder) is one this adapter knows."""
        raise NotImplementedError

    def picture(self, bundle: Path, split: str = "eval", index: int = 0) -> Axes | None:
        """A picture of one task of ``split``: what the model is asked to act on."""
        return None

    def baselines(self, bundle: Path, split: str = "eval") -> dict[str, float] | None:
        """Scores of fixed policies on ``split``'s tasks, by name, scored as the verifier scores the model."""
        return None

    def reference(self) -> tuple[str, dict[str, dict[int, float]]] | None:
        """Published runs to read a run against: what they trained and on what, and each run's eval reward by
        step."""
        return None

    def expert(self) -> Expert | None:
        """The expert: a function that plays one task (a row of the bundle's dataset) through ``act(tool,
        arguments)``, which calls a tool of the task's env and returns its result, and returns the reply its turn
        ends with. ``train.warm_start.demos.expert_demonstrations`` plays it through the env, the task's verifier scores
        each episode, and only those scoring 1 are learned from."""
        return None


def adapters() -> list[TaskAdapter]:
    """The kit's adapters, then those installed packages register under ``agentenv_nb.task_adapters``."""
    from importlib.metadata import entry_points

    from agentenv_nb.tasks.gridsim.adapter import GridSimAdapter

    return [GridSimAdapter(), *(point.load()() for point in entry_points(group=ENTRY_POINTS))]


def adapter_for(bundle: str | Path) -> TaskAdapter | None:
    """The first adapter that recognises the bundle folder ``bundle``, or None: then the notebooks show the views
    any bundle has (``notebook.views``)."""
    return next((adapter for adapter in adapters() if adapter.recognises(Path(bundle))), None)
