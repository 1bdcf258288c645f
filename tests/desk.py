"""The bundle docs/own-bundle.md builds (``desk``: two toolsets, two-turn tasks, a verifier a turn), written by running
that page's ``make_desk.py`` as it is written there, and the notebook parameters that page gives for it. No GridSim
code touches it."""

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "own-bundle.md"


def page_script(name: str = "make_desk.py") -> str:
    """The code block of the page titled ``name``, as a reader copies it."""
    [code] = re.findall(rf'```python title="{re.escape(name)}"\n(.*?)```', DOC.read_text(), re.S)
    return code


def write_desk(folder: Path) -> tuple[Path, Path]:
    """Run the page's script in ``folder``; the bundle and the demonstrations file it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "make_desk.py").write_text(page_script())
    subprocess.run([sys.executable, "make_desk.py"], cwd=folder, check=True, capture_output=True)
    return folder / "bundles" / "desk", folder / "desk-demos.jsonl"


def desk_parameters(bundle: Path, demos: Path, server_processes: int = 2) -> dict[str, str]:
    """The page's notebook parameters for desk, as ``AGENTENV_NB_<NAME>`` values, served from processes."""
    return {"BUNDLE": str(bundle), "REWARD": "mean", "TOOLSETS": "each", "DEMOS": str(demos),
            "SERVER_PROCESSES": str(server_processes)}


def check_desk_run(run_dir: Path, notebooks: list) -> None:
    """What the four notebooks run on desk must show: the warm start said it learnt from the demonstrations, no output
    names GridSim, GRPO trained both toolsets of one dataset on the mean of each task's two scores, and the trained
    adapter was saved."""
    import json

    shown = [output.get("text", "") + json.dumps(output.get("data", {})) for notebook in notebooks
             for cell in notebook.cells for output in cell.get("outputs", [])]
    named = [text[:200] for text in shown if "gridsim" in text.lower()]
    assert not named, f"a notebook names GridSim on a bundle of its own: {named[:3]}"
    assert any("warm start from demonstrations: 6 demonstrations" in text for text in shown)
    log = json.loads((run_dir / "grpo" / "trainer_state.json").read_text())["log_history"]
    logged = {key for entry in log for key in entry}
    toolsets = {"/".join(key.split("/")[1:3]) for key in logged if key.startswith("scores/")}
    assert toolsets == {"desk/sum-12-5", "desk/word-fathom"}, toolsets  # a class a toolset, rows routed to each
    assert {"scores/desk/sum-12-5/answer/mean", "scores/desk/sum-12-5/follow_up/mean"} <= logged
    assert [entry["reward"] for entry in log if "reward" in entry], "no step was rewarded"
    assert (run_dir / "trained" / "adapter").is_dir()
