"""A new user's own bundle whose verifiers give no partial credit, written here as docs/own-bundle.md tells a user to
write one (tasks/*.json and evals/*.toml by hand, demonstrations in the page's format), through the four notebooks on
the tiny CPU settings: the tiny random model learns the form of a call, not the answers, so its warm start scores 0,
and notebook 02 says so in a warning, saves it, and the run goes on. Run before the notebooks they need, notebooks 03
and 04 stop at their first check with one line saying which notebook to run, and the demo runner names the notebook
and the cell in plain text."""

import json
import os
import re
import subprocess
import sys

import nbformat
import pytest

from agentenv_nb.notebook.params import QUICK, TINY
from agentenv_nb.settings import PREFIX

from .conftest import STARTED_WITH, stderr_lines

pytestmark = pytest.mark.slow
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo",
            "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago"}
SYSTEM = "Answer each question with end_turn(response=...)."


def write_quiz(root):
    """Two-turn tasks with no env (the model's one tool is end_turn) and a verifier a turn that scores 1 for the
    right capital and 0 for anything else; the demonstrations of the train tasks, end_turn's tool message carrying the
    next turn's prompt. No agent_name: the deploy and the prompts share agent_env's default agent."""
    (root / "tasks").mkdir(parents=True)
    (root / "evals").mkdir()
    names, demos = list(CAPITALS), []
    for first, second in zip(names, names[1:] + names[:1]):
        asked = [f"What is the capital of {first}?", f"And of {second}?"]
        steps = [{"id": "quizzer", "type": "deploy_agent", "system_prompt": SYSTEM}]
        for turn, (prompt, country) in enumerate(zip(asked, (first, second))):
            steps += [{"id": f"ask-{turn}", "type": "prompt_agent", "prompt": prompt, "prompt_id": f"ask-{turn}",
                       "depends_on": [steps[-1]["id"]], "poll_interval_seconds": 0.1},
                      {"id": f"check-{turn}", "type": "agent_prompt_response_verifier", "prompt_id": f"ask-{turn}",
                       "verifier_id": f"check-{turn}", "depends_on": [f"ask-{turn}"],
                       "criteria": [{"type": "response_contains", "needles": [CAPITALS[country]]}]}]
        (root / "tasks" / f"{first.lower()}.json").write_text(json.dumps(steps))
        demos.append({"messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": asked[0]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "end_turn", "arguments": {"response": CAPITALS[first]}}}]},
            {"role": "tool", "name": "end_turn", "content": asked[1]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "end_turn", "arguments": {"response": CAPITALS[second]}}}]}]})
    tasks = [name.lower() for name in names]
    (root / "evals" / "train.toml").write_text(f"tasks = {json.dumps(tasks[:6])}\n")
    (root / "evals" / "eval.toml").write_text(f"tasks = {json.dumps(tasks[6:])}\n")
    with open(root.parent / "quiz-demos.jsonl", "w") as out:
        out.writelines(json.dumps(demo) + "\n" for demo in demos[:6])
    return root, root.parent / "quiz-demos.jsonl"


@pytest.fixture
def fresh_parameters(monkeypatch):
    """The environment a user's kernel starts with: no variable an earlier test's imports set, and none of the tiny
    defaults (the runner sets them; each is recorded first, so it is put back afterwards)."""
    for name in set(os.environ) - set(STARTED_WITH):
        monkeypatch.delenv(name)
    for name in [*(PREFIX + name for name in (*TINY, *QUICK, "RUN_DIR", "BUNDLES_DIR", "LIBRARY_LOG", "BUNDLE",
                                              "REWARD", "DEMOS", "TOOLSETS", "SFT_STEPS")), "XDG_STATE_HOME"]:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def demo(out, *args):
    return subprocess.run([sys.executable, "-m", "agentenv_nb.notebook.demo", str(out), *args], capture_output=True,
                          text=True, timeout=600)


def outputs(notebook) -> list[str]:
    return [output.get("text", "") + output.get("data", {}).get("text/plain", "") for cell in notebook.cells
            if cell.cell_type == "code" for output in cell.outputs]


def test_a_bundle_without_partial_credit_runs_the_four_notebooks_with_a_warning(tmp_path, fresh_parameters):
    bundle, demos = write_quiz(tmp_path / "quiz")
    for name, value in {"BUNDLE": bundle, "REWARD": "mean", "DEMOS": demos, "SFT_STEPS": "100", **QUICK}.items():
        fresh_parameters.setenv(PREFIX + name, str(value))
    out = tmp_path / "out"
    done = demo(out)
    assert done.returncode == 0, done.stderr[-3000:]
    notebooks = {path.stem[:2]: nbformat.read(path, as_version=4) for path in sorted(out.glob("0*.ipynb"))}
    assert list(notebooks) == ["01", "02", "03", "04"]
    for number, notebook in notebooks.items():
        assert not stderr_lines(notebook), f"{number} writes to stderr: {stderr_lines(notebook)[:10]}"
        shown = [output.get("data", {}) for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
        assert not [data for data in shown if "application/vnd.jupyter.widget-view+json" in data], number
        assert number == "01" or any("image/png" in data for data in shown), f"{number} saved no figure"
    warm = outputs(notebooks["02"])
    assert any(text.startswith("warning: the model's answers scored nothing") and "no partial credit" in text
               for text in warm), warm
    assert any(text.startswith("trainable parameters:") and "a full fine-tune, not LoRA" in text for text in warm)
    assert any("trained to step 100 of 100" in text for text in warm), warm  # SFT_STEPS, not the preset's 200
    assert (out / "run" / "sft" / "merged").is_dir() and (out / "run" / "trained" / "adapter").is_dir()
    assert (out / "run" / "eval_curve.png").is_file()


def test_a_notebook_run_before_the_one_it_needs_says_which_in_one_line(tmp_path, fresh_parameters):
    out = tmp_path / "out"
    for number, needs in [("03", f"no warm start at {out / 'run'}/sft/merged: run notebook 02"),
                          ("04", f"no GRPO run in {out / 'run'}/grpo (no trainer_state.json there): run notebook 03")]:
        failed = demo(out, "--only", number)
        assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
        assert not re.search(r"\x1b\[", failed.stderr), failed.stderr  # no colour codes
        assert len(failed.stderr.splitlines()) == 1, failed.stderr  # what else was said, where it isn't one line
        [line] = failed.stderr.splitlines()
        assert line.startswith(f"python -m agentenv_nb.notebook.demo: {number}_") and needs in line, line
        cell = r"failed at cell \d+ of \d+, In \[\d+\] \((warm_start = )?need_(warm_start|grpo_logs)\(RUN_DIR"
        assert re.search(cell, line), line
        # the notebook shows that line alone, in place of a traceback, at its first cell after the parameters
        [saved] = out.glob(f"{number}_*.ipynb")
        notebook = nbformat.read(saved, as_version=4)
        [error] = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
                   if output.output_type == "error"]
        assert len(error.traceback) == 1 and needs in error.traceback[0], error.traceback
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        check = next(i for i, cell in enumerate(code) if "parameters" in cell.metadata.get("tags", [])) + 1
        assert error in code[check].outputs, "the check is not the first cell after the parameters"
        assert not [cell for cell in code[check + 1:] if cell.execution_count], "it ran on past its check"
