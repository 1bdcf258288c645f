"""Run the four notebooks top to bottom on the tiny bundle and model, on CPU, and keep what they made:

    python -m agentenv_nb.demo runs/demo

writes the executed notebooks, the run (bundle, SFT model, GRPO checkpoints and logs) and the eval curve (PNG
and CSV) under ``runs/demo``, and prints each notebook's wall time. ``AGENTENV_NB_*`` variables change any
notebook parameter (``agentenv_nb.notebook.params``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient

from agentenv_nb.notebook.params import use_tiny_defaults

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebooks(out: Path, timeout: int = 900, tiny: bool = True, only: str = "[0-9][0-9]") -> dict[str, float]:
    """Execute each notebook whose number matches ``only`` (a glob: "02", every one by default) in order into ``out``
    (on the tiny defaults unless ``tiny`` is False: then as the ``AGENTENV_NB_*`` variables say); returns the wall
    seconds of each. Stops at the first that fails, naming it; its executed copy, with the error, is kept in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if tiny:
        use_tiny_defaults(out.resolve() / "run")
    os.environ.setdefault("MPLBACKEND", "Agg")
    seconds, sockets = {}, tempfile.TemporaryDirectory(prefix="agentenv_nb-kernels-")
    for path in sorted(NOTEBOOKS.glob(f"{only}_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            execute(notebook, NOTEBOOKS, Path(sockets.name) / path.stem, timeout)
        finally:
            seconds[path.stem] = time.perf_counter() - start
            nbformat.write(notebook, out / path.name)
        print(f"{path.stem}: {seconds[path.stem]:.1f} s", flush=True)
    return seconds


def execute(notebook, cwd: Path, sockets: Path, timeout: int, env: dict[str, str] | None = None) -> None:
    """Run ``notebook`` in place, top to bottom, in a fresh kernel working in ``cwd`` (with ``env``, else this
    process's environment). The kernel talks over IPC sockets at ``sockets``: over TCP (jupyter_client's default)
    its traffic is plain text on a port anyone on the machine can listen to, and ipykernel warns so at each start."""
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets))
    try:
        NotebookClient(notebook, km=kernel, timeout=timeout, resources={"metadata": {"path": str(cwd)}}).execute(
            env=dict(os.environ) if env is None else env)
    finally:
        if kernel.has_kernel:
            kernel.shutdown_kernel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_nb.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="runs/demo", help="the folder to write to (default runs/demo)")
    out = parser.parse_args(argv).out
    times = run_notebooks(Path(out))
    print(f"all four: {sum(times.values()):.1f} s; the eval curve is in {out}/run")
