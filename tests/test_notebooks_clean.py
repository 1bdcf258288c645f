"""The notebooks are committed as tutorials: no outputs, the set-up cell first (nothing of the kit is there before it
on a fresh Colab or Kaggle runtime), then a tagged parameters cell, short cells."""

import json
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
