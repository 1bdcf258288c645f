"""What a notebook shows of any bundle, with or without a task adapter (``tasks.adapters``): its tasks by split, the
tools each toolset offers, the lines a reward is read against, and how a model's scores spread.

    views.splits(bundle)                         # a row a split: how many tasks
    views.tools(env)                             # a row a tool of each toolset: its arguments and description
    views.score_distribution({"before SFT": rollouts})
    views.baselines(bundle, run_dir)             # an adapter's baselines, else the eval reward before training
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentenv_nb.tables import text_table
from agentenv_nb.tasks import adapters, bundles
from agentenv_nb.train.rollout import STAGES, greedy_evals

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from pandas.io.formats.style import Styler

BEFORE = STAGES[0]


def splits(bundle: str | Path) -> pd.DataFrame:
    """How many tasks each split (an eval of the bundle) holds, and how many tasks the bundle has in all."""
    import pandas as pd

    tasks = bundles.describe(bundle)
    counts = tasks["splits"].str.split(", ").explode().replace("", pd.NA).dropna().value_counts(sort=False)
    return pd.concat([counts, pd.Series({"all": len(tasks)})]).rename_axis("split").to_frame("tasks")


def tools(env) -> Styler:
    """A row a tool of each toolset ``env`` (an ``AgentEnv``) plays: the toolset, the tool, its arguments (a ``*``
    marks a required one) and its whole description, wrapped (``tables.text_table``; ``.data`` is the DataFrame).
    ``end_turn`` is every toolset's: it ends the model's turn."""
    import pandas as pd

    from agentenv_nb.client.environment import server_tools

    rows = []
    for toolset, cls in env.factories.items():
        for tool in server_tools(cls):
            schema = tool.get("input_schema") or tool.get("inputSchema") or {}
            required = set(schema.get("required", []))
            arguments = ", ".join(name + ("*" if name in required else "") for name in schema.get("properties", {}))
            rows.append({"toolset": toolset, "tool": tool["name"], "arguments": arguments,
                         "description": (tool.get("description") or "").strip()})
    return text_table(pd.DataFrame(rows))


def as_image(figure: Figure):
    """``figure`` as a plain PNG output, which every viewer shows, whatever matplotlib backend the kernel has."""
    import io

    from IPython.display import Image

    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    return Image(data=png.getvalue(), format="png")


def score_distribution(results: dict[str, list[dict]], bins: int = 10):
    """How the rollouts' rewards spread, one histogram a label (``{"before SFT": rollouts, ...}``), the unscored
    left out and counted in the legend; a PNG image."""
    from matplotlib.figure import Figure

    ax = Figure(figsize=(8, 3), layout="constrained").subplots()
    for label, rollouts in results.items():
        rewards = [r["reward"] for r in rollouts if r["reward"] is not None]
        unscored = len(rollouts) - len(rewards)
        ax.hist(rewards, bins=bins, range=(0, 1), alpha=0.5,
                label=f"{label}: {len(rewards)} scored" + (f", {unscored} unscored" if unscored else ""))
    ax.set(xlabel="reward", ylabel="tasks", title="Reward by task")
    ax.legend(fontsize=8)
    return as_image(ax.figure)


def baselines(bundle: str | Path, run_dir: str | Path) -> dict[str, float]:
    """The lines a run's reward is read against: the task adapter's baselines where the bundle has them, else the
    eval reward before training that notebook 02 measured (RUN_DIR/greedy-evals.csv), else none."""
    adapter = adapters.adapter_for(bundle)
    found = adapter.baselines(Path(bundle)) if adapter else None
    if found:
        return found
    table = greedy_evals(run_dir)
    return {"before training": float(table.loc["reward", BEFORE])} if BEFORE in table else {}


def reference(bundle: str | Path) -> tuple[str, dict[str, dict[int, float]]] | None:
    """The published runs a task adapter compares a run against, or None where no adapter has any."""
    adapter = adapters.adapter_for(bundle)
    return adapter.reference() if adapter else None


def adapter_view(adapter: adapters.TaskAdapter | None, bundle: str | Path):
    """What a task adapter adds, shown: a picture of an eval task and the baselines' mean scores as a table (returned);
    without an adapter, or where it has neither, a printed line saying so (the baseline is then the eval reward before
    training)."""
    import pandas as pd
    from IPython.display import display

    bundle = Path(bundle)
    picture = adapter.picture(bundle) if adapter else None
    found = adapter.baselines(bundle) if adapter else None
    if picture is not None:
        import matplotlib.pyplot as plt

        display(as_image(picture.figure))
        plt.close(picture.figure)  # shown once: not again by the inline backend at the cell's end
    if found:
        return pd.Series(found, name="mean score on the eval tasks").round(3).to_frame()
    # printed, not returned: a cell's returned string shows as a quoted Python string
    print((f"{adapter.name}'s task adapter has no baselines" if adapter else "No task adapter knows this bundle") +
          ": the baseline is the eval reward before training, which notebook 2 measures")
    return None
