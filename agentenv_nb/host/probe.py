"""What this machine is, read once without importing torch: the notebook host, the NVIDIA driver and the CUDA it runs,
each GPU's name, compute capability and memory, the runtime's own torch and the CUDA it was built for, and its Python.

    host = read_host()          # nvidia-smi, the environment, installed packages' files
    host = Host.from_dict({...})  # what a host's probes would read, as the tests give Colab's T4 or an H200

A test feeds ``Host`` directly: every decision (``host.plan``) is a pure function of it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The newest CUDA each driver branch runs, where nvidia-smi's header doesn't say (NVIDIA's CUDA toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions")
DRIVER_CUDA = ((580, (13, 0)), (575, (12, 9)), (570, (12, 8)), (560, (12, 6)), (555, (12, 5)), (550, (12, 4)),
               (545, (12, 3)), (535, (12, 2)), (530, (12, 1)), (525, (12, 0)), (520, (11, 8)), (515, (11, 7)),
               (510, (11, 6)), (495, (11, 5)), (470, (11, 4)), (465, (11, 3)), (460, (11, 2)), (455, (11, 1)),
               (450, (11, 0)))


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]  # compute capability: 7.5 a T4, 8.9 an L4, 9.0 an H100/H200
    memory_gb: float  # the card's, as nvidia-smi reports it (MiB / 1024)

    @property
    def bf16(self) -> bool:
        """Whether the card computes in bf16. From 8.0 (Ampere) on: a T4 only emulates it, though torch's
        ``is_bf16_supported()`` says yes by trying a tensor."""
        return self.capability >= (8, 0)


@dataclasses.dataclass(frozen=True)
class Host:
    notebook: str = ""  # "colab", "kaggle", "jupyter" (another notebook server) or "" (a script)
    driver: str | None = None  # the NVIDIA driver's version, e.g. "550.54.15"; None: no driver
    driver_cuda: tuple[int, int] | None = None  # the newest CUDA that driver runs
    gpus: tuple[Gpu, ...] = ()
    torch: str | None = None  # the runtime's installed torch, e.g. "2.11.0+cu128"; None: none
    torch_cuda: tuple[int, int] | None = None  # the CUDA that torch was built for; None: a CPU build
    python: str = ""  # the interpreter's version, e.g. "3.13.15" (Colab's): wheels are built for each

    @property
    def gpu(self) -> Gpu | None:
        """The GPU a notebook trains on: the first."""
        return self.gpus[0] if self.gpus else None

    @classmethod
    def from_dict(cls, seen: dict) -> Host:
        """A host from what its probes read: ``gpus`` as [name, "7.5", memory GB] rows, versions as text."""
        return cls(notebook=seen.get("notebook", ""), driver=seen.get("driver"),
                   driver_cuda=_version(seen.get("driver_cuda")) or cuda_of_driver(seen.get("driver")),
                   gpus=tuple(Gpu(name, _version(capability), float(memory)) for name, capability, memory in
                              seen.get("gpus", ())),
                   torch=seen.get("torch"), torch_cuda=_version(seen.get("torch_cuda")), python=seen.get("python", ""))

    def describe(self) -> str:
        """The host in a few words: "Colab, Tesla T4 (7.5, 15 GB), driver 580.82.07 (CUDA 13.0), torch 2.11.0+cu130,
        Python 3.13"."""
        where = {"colab": "Colab", "kaggle": "Kaggle", "jupyter": "Jupyter"}.get(self.notebook, "this machine")
        if not self.gpus:
            card = "no GPU"
        else:
            gpu = self.gpu
            many = f"{len(self.gpus)} x " if len(self.gpus) > 1 else ""
            card = f"{many}{gpu.name} ({gpu.capability[0]}.{gpu.capability[1]}, {gpu.memory_gb:.0f} GB)"
            card += f", driver {self.driver} (CUDA {version_text(self.driver_cuda)})"
        torch = f"torch {self.torch}" if self.torch else "no torch"
        python = f", Python {'.'.join(self.python.split('.')[:2])}" if self.python else ""
        return f"{where}, {card}, {torch}{python}"


def _version(text) -> tuple[int, int] | None:
    if text is None or isinstance(text, tuple):
        return text
    match = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(match[1]), int(match[2])) if match else None


def version_text(version: tuple[int, int] | None) -> str:
    return f"{version[0]}.{version[1]}" if version else "none"


def cuda_of_driver(driver: str | None) -> tuple[int, int] | None:
    """The newest CUDA a driver of version ``driver`` runs, from its branch."""
    if not driver:
        return None
    branch = int(driver.split(".")[0])
    return next((cuda for first, cuda in DRIVER_CUDA if branch >= first), None)


def notebook_host(environ=os.environ) -> str:
    """Colab, Kaggle, another Jupyter server, or none, from the variables each sets in its kernels."""
    if "COLAB_RELEASE_TAG" in environ or "COLAB_GPU" in environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ:
        return "kaggle"
    return "jupyter" if "JPY_PARENT_PID" in environ or "ipykernel" in sys.modules else ""


def read_gpus() -> tuple[str | None, tuple[int, int] | None, tuple[Gpu, ...]]:
    """The driver's version, the CUDA it runs and the GPUs, from nvidia-smi; (None, None, ()) without one."""
    if shutil.which("nvidia-smi") is None:
        return None, None, ()
    query = ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        rows = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):  # a driver that doesn't answer is no GPU to train on
        return None, None, ()
    gpus, driver = [], None
    for row in filter(None, rows.strip().splitlines()):
        name, capability, memory, driver = (field.strip() for field in row.split(","))
        gpus.append(Gpu(name, _version(capability), float(memory) / 1024))
    said = re.search(r"CUDA Version:\s*(\d+\.\d+)", header)
    return driver, _version(said[1]) if said else cuda_of_driver(driver), tuple(gpus)


def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build() -> tuple[str | None, tuple[int, int] | None]:
    """The installed torch's version and the CUDA it was built for, read from its files: importing torch would load
    the very libraries a set-up may be about to replace."""
    version = installed("torch")
    if version is None:
        return None, None
    spec = importlib.util.find_spec("torch")
    built = Path(spec.origin).with_name("version.py") if spec and spec.origin else None
    text = built.read_text() if built and built.is_file() else ""
    cuda = re.search(r"^cuda\b[^=\n]*=\s*['\"](\d+\.\d+)", text, re.MULTILINE)
    return version, _version(cuda[1]) if cuda else None


@functools.cache
def read_host() -> Host:
    """This machine, read once a process."""
    driver, cuda, gpus = read_gpus()
    torch, torch_cuda = torch_build()
    return Host(notebook_host(), driver, cuda, gpus, torch, torch_cuda, platform.python_version())
