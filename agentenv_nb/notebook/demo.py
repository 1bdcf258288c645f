"""Run the four notebooks top to bottom on the tiny bundle and model, on CPU, and keep what they made:

    python -m agentenv_nb.notebook.demo runs/demo

writes the executed notebooks, the run (bundle, SFT model, GRPO checkpoints and logs) and the eval curve (PNG
and CSV) under ``runs/demo``, and prints each notebook's wall time. ``AGENTENV_NB_*`` variables change any
notebook parameter (``agentenv_nb.notebook.params``). A notebook that fails stops the run with one plain line
naming it, the cell and the error, and exit status 1; its executed copy keeps the whole error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from agentenv_nb.notebook.params import use_tiny_defaults

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # IPython colours a traceback's text with these
KERNEL_START_S = 300  # a kernel's start, not nbclient's 60 s: on 2 busy cores (CI's two lanes) it once took longer


class NotebookFailed(RuntimeError):
    """A notebook stopped at a cell; the message names both and the error, in plain text."""


def run_notebooks(out: Path, timeout: int = 900, tiny: bool = True, only: str = "[0-9][0-9]") -> dict[str, float]:
    """Execute each notebook whose number matches ``only`` (a glob: "02", every one by default) in order into ``out``
    (on the tiny defaults unless ``tiny`` is False: then as the ``AGENTENV_NB_*`` variables say); returns the wall
    seconds of each. Stops at the first that fails with NotebookFailed, naming it and the cell; its executed copy,
    with the error, is kept in ``out``."""
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
        except (CellExecutionError, CellTimeoutError) as error:
            raise NotebookFailed(f"{path.stem} failed at {failed_cell(notebook)}: {plain_error(error)} (its executed "
                                 f"copy, with the whole error: {out / path.name})") from None
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
        NotebookClient(notebook, km=kernel, timeout=timeout, startup_timeout=KERNEL_START_S,
                       resources={"metadata": {"path": str(cwd)}}).execute(env=dict(os.environ) if env is None else env)
    finally:
        if kernel.has_kernel:
            kernel.shutdown_kernel()


def failed_cell(notebook) -> str:
    """The cell a run stopped at, as a person finds it: its place, its prompt number, its first line."""
    code = [(number, cell) for number, cell in enumerate(notebook.cells, 1) if cell.cell_type == "code"]
    # the cell with an error output, else (a timeout) the first that never finished
    number, cell = next(((n, c) for n, c in code if any(o.output_type == "error" for o in c.outputs)), None) or \
        next(((n, c) for n, c in code if not c.execution_count), code[-1])
    lines = [line.strip() for line in cell.source.splitlines() if line.strip()]
    first = next((line for line in lines if not line.startswith(("#", "from ", "import "))), lines[0] if lines else "")
    prompt = f", In [{cell.execution_count}]" if cell.execution_count else ""
    return f"cell {number} of {len(notebook.cells)}{prompt} ({first})"


def plain_error(error: CellExecutionError | CellTimeoutError) -> str:
    """The error a cell raised, ``Name: message`` on one line, without the colour codes IPython adds."""
    if isinstance(error, CellTimeoutError):
        return "the cell ran past the runner's timeout"
    text = ANSI.sub("", f"{error.ename}: {error.evalue}")
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_nb.notebook.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="runs/demo", help="the folder to write to (default runs/demo)")
    parser.add_argument("--only", default="[0-9][0-9]", help="the notebooks to run, by number or a glob of it: "
                        "03, or 0[34] (default: all four)")
    args = parser.parse_args(argv)
    try:
        times = run_notebooks(Path(args.out), only=args.only)
    except NotebookFailed as failed:
        print(f"{parser.prog}: {failed}", file=sys.stderr)
        sys.exit(1)
    ran = "all four" if len(times) == 4 else ", ".join(times)
    print(f"{ran}: {sum(times.values()):.1f} s; the run is in {args.out}/run")


if __name__ == "__main__":
    main()
