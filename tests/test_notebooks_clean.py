"""The notebooks are committed as tutorials: no outputs, a tagged parameters cell first, short cells."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_four_notebooks_are_there():
    assert [p.stem for p in NOTEBOOKS] == ["01_download_gridsim", "02_sft_warm_start", "03_grpo",
                                          "04_eval_curve"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_a_parameters_cell(path):
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert not [c for c in code if c.get("outputs") or c.get("execution_count")], "clear the outputs"
    assert "parameters" in code[0]["metadata"].get("tags", []), "the first code cell is the parameters cell"
    assert all(len("".join(c["source"]).splitlines()) <= 12 for c in code[1:]), "logic belongs in agentenv_nb"
    assert not any("def " in "".join(c["source"]) for c in code), "no function definitions in the notebooks"


def test_the_colab_install_line_is_the_readme_s():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    [line] = [line for line in readme.splitlines() if line.startswith("!git clone")]
    for path in NOTEBOOKS:
        markdown = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                           if c["cell_type"] == "markdown")
        assert f"\n{line}\n" in markdown, f"{path.stem}: the Colab install line differs from README's"
