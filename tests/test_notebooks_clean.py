"""The notebooks are committed as tutorials: no outputs, the set-up cell first (nothing of the kit is there before it
on a fresh Colab or Kaggle runtime), then a tagged parameters cell, short cells; the settings they share are the
run's, with its defaults."""

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_four_notebooks_are_there():
    assert [p.stem for p in NOTEBOOKS] == ["01_download_gridsim", "02_sft_warm_start", "03_grpo",
                                          "04_eval_curve"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_with_the_set_up_cell_then_a_parameters_cell(path):
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert not [c for c in code if c.get("outputs") or c.get("execution_count")], "clear the outputs"
    assert "".join(code[0]["source"]).endswith("-m agentenv_nb.host"), "the first code cell is the set-up cell"
    assert "parameters" in code[1]["metadata"].get("tags", []), "the parameters cell comes right after the set-up"
    assert all(len("".join(c["source"]).splitlines()) <= 12 for c in code[2:]), "logic belongs in agentenv_nb"
    assert not any("def " in "".join(c["source"]) for c in code), "no function definitions in the notebooks"


def test_the_set_up_cell_is_one_text_and_the_readme_shows_it():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    set_up = {"".join(next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")["source"])
              for path in NOTEBOOKS}
    assert len(set_up) == 1, "the notebooks' set-up cells differ"
    assert f"```python\n{set_up.pop()}\n```" in readme, "README's set-up cell differs from the notebooks'"


def parameter_lines(path: Path) -> dict[str, tuple[str, str]]:
    """The parameters cell's assignments: each name's value and its comment, as written."""
    cell = "".join([c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"][1]["source"])
    return {name: (value.strip(), comment) for name, value, comment in
            re.findall(r"^([A-Z_]+) = (.+?)  # (.+)$", cell, re.M)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_settings_the_notebooks_share_are_the_run_s_with_its_words(path):
    """What to train on, where, and the env servers: each notebook that takes one has the run's default (``GRPORun``,
    the one home) and says what it is in the run's words; the most server processes as ``servers_for_host`` has it."""
    from agentenv_nb.envs.serve.processes import MOST_SERVERS
    from agentenv_nb.train.grpo.run import GRPORun

    lines, run = parameter_lines(path), GRPORun()
    assert {"BUNDLE", "BUNDLES_DIR", "RUN_DIR"} <= set(lines)
    for name in ("BUNDLE", "BUNDLES_DIR", "RUN_DIR", "SANDBOX"):
        if name in lines:
            value, comment = lines[name]
            assert ast.literal_eval(value) == getattr(run, name.lower()), name
            assert name == "SANDBOX" or GRPORun.help(name).startswith(comment), name
    if "SERVER_PROCESSES" in lines:
        assert f"up to {MOST_SERVERS};" in lines["SERVER_PROCESSES"][1]
