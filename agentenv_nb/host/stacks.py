"""The known-good package sets a notebook host can run, in one place: requirements-gpu.txt is the pinned CUDA-13
set, and each other set is that file with its torch and vLLM lines changed. Every other pin is shared.

    stack = STACKS["cuda12"]
    stack.requirements()                 # the pins it installs, requirements-gpu.txt's with its changes
    stack.requirements(keep_torch="2.11.0+cu128")   # a set that keeps the runtime's own torch
    missing(stack, keep_torch=...)       # pins not met here: [] once it is installed

CUDA-13 builds need a driver of the 580 branch or newer; CUDA-12 builds run on a 525 or newer, and on CUDA-13
drivers too. vLLM's wheels on PyPI are CUDA-13 builds from 0.20.0 on, by its release notes.

A runtime whose torch has a vLLM release built for it (``VLLM_FOR_TORCH``) keeps that torch and adds that vLLM
(``for_runtime_torch``): nothing of torch, triton, NCCL or cuDNN is downloaded again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentenv_nb.host.probe import installed

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements-gpu.txt"
KEEP = "keep"  # a set's torch: the runtime's own, left as it is
# The vLLM release built for a torch, by torch's minor version: each vLLM pins the torch it is built for exactly. Each
# pair resolves with every other pin of requirements-gpu.txt unchanged (pip's dry run for CPython 3.12 and 3.13,
# manylinux wheels only): 2.11 -> 0.26.0 gives 322 distributions, with triton 3.6.0, torchvision 0.26.0 and torchaudio
# 2.11.0 (a runtime's own, beside its torch) and flashinfer-python 0.6.14; vLLM 0.26.0 asks transformers>=5.5.3 (5.17.0
# is pinned); torchao 0.18.0 pins no torch; xformers 0.0.35 (unsloth's) is removed as in the other sets but cuda12.
VLLM_FOR_TORCH = {"2.11": "0.26.0"}
VLLM_CUDA = (13, 0)  # the CUDA of vLLM's wheels on PyPI (0.20.0 on), and so of the torch such a set keeps
# The newest vLLM that loads 4-bit models through its own bitsandbytes support: with it, vllm-bnb-plugin registers
# its op a second time and fails (https://github.com/vllm-project/vllm/issues/52802), so such a set leaves it out
VLLM_BNB_IN_TREE = (0, 27, 1)


@dataclasses.dataclass(frozen=True)
class Stack:
    name: str
    cuda: tuple[int, int] | None  # the CUDA its torch (and vLLM) is built for; None: the runtime's torch's
    changes: dict = dataclasses.field(default_factory=dict)  # {name: pin, KEEP, or None to leave it out}
    minutes: int = 5  # about how long it installs on a notebook host, said where its download can't be sized
    ran: str = ""  # where it ran end to end; "" if it is decided but was not run
    torch_index: str | None = None  # the index its torch comes from, where not PyPI
    keeps_torch: str = ""  # the runtime torch's minor version a set adding the vLLM built for it needs, e.g. "2.11"

    @property
    def vllm(self) -> bool:
        return self.changes.get("vllm", "") is not None

    def without_vllm(self) -> Stack:
        """The same set without vLLM, for a card no vLLM build of it runs on."""
        return dataclasses.replace(self, name=f"{self.name}-no-vllm",
                                   changes={**self.changes, "vllm": None, "vllm-bnb-plugin": None}, minutes=3)

    def describe(self, keep_torch: str | None = None) -> str:
        """What it installs, in a few words: "torch 2.10.0 and vLLM 0.19.1, CUDA 12.8 builds"."""
        pins = dict(pin.split("==") for pin in self.requirements(keep_torch) if pin.startswith(("torch==", "vllm==")))
        if self.changes.get("torch") == KEEP:
            torch = f"the runtime's torch {keep_torch} kept" + (f", with vLLM {pins['vllm']} built for it" if self.vllm
                                                               else "")
        else:
            build = f"CUDA {self.cuda[0]}.{self.cuda[1]}" if self.cuda else "CPU"
            torch = f"torch {pins['torch']}" + (f" and vLLM {pins['vllm']}, {build} builds" if self.vllm else
                                                 f", a {build} build")
        return torch + ("" if self.vllm else ", no vLLM")

    def requirements(self, keep_torch: str | None = None) -> list[str]:
        """The pins this set installs: requirements-gpu.txt's lines with this set's changes; where it keeps the
        runtime's torch, ``keep_torch`` (that torch's version) pinned so that nothing replaces it."""
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        pins = []
        for line in REQUIREMENTS.read_text().splitlines():
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            name = canonicalize_name(Requirement(text).name)
            change = self.changes.get(name, text)
            if change == KEEP:
                change = f"torch=={keep_torch}" if keep_torch else None
            if change is not None:
                pins.append(change)
        return pins

    @property
    def uninstalls(self) -> tuple[str, ...]:
        """What it removes: xformers, whose one release (0.0.35) is built for torch 2.10 and fails to load beside
        another torch (Unsloth then says so in every notebook)."""
        torch = self.changes.get("torch", "")
        return () if torch.startswith("torch==2.10.") else ("xformers",)


STACKS = {stack.name: stack for stack in (
    Stack("cuda13", (13, 0),
          minutes=6, ran="an H200 on driver 580 (CUDA 13.0)"),
    # vLLM 0.19.1 predates vllm-bnb-plugin's need: its bitsandbytes support is in-tree
    Stack("cuda12", (12, 8), changes={"torch": "torch==2.10.0", "vllm": "vllm==0.19.1", "vllm-bnb-plugin": None},
          minutes=6),
    Stack("runtime", None, changes={"torch": KEEP, "vllm": None, "vllm-bnb-plugin": None}, minutes=2,
          ran="an H200 on its own torch 2.11.0+cu130, and CI's CPU on torch 2.13.0 (Python 3.11 and 3.13)"),
    Stack("cpu", None, changes={"vllm": None, "vllm-bnb-plugin": None}, minutes=3,
          torch_index="https://download.pytorch.org/whl/cpu"),
    # A set for each torch of VLLM_FOR_TORCH: the runtime's torch kept, the vLLM built for it added
    *(Stack(f"runtime-{minor}-vllm", VLLM_CUDA, minutes=3, keeps_torch=minor,
            changes={"torch": KEEP, "vllm": f"vllm=={vllm}",
                     **({"vllm-bnb-plugin": None} if tuple(map(int, vllm.split("."))) <= VLLM_BNB_IN_TREE else {})})
      for minor, vllm in VLLM_FOR_TORCH.items()),
)}


def for_runtime_torch(torch: str | None, torch_cuda: tuple[int, int] | None) -> Stack | None:
    """The set that keeps a runtime's torch and adds the vLLM built for it, where that torch has one: its minor version
    in ``VLLM_FOR_TORCH``, and a build for vLLM's CUDA."""
    minor = ".".join(torch.split(".")[:2]) if torch else ""
    fits = minor in VLLM_FOR_TORCH and torch_cuda is not None and torch_cuda[0] == VLLM_CUDA[0]
    return STACKS[f"runtime-{minor}-vllm"] if fits else None


def missing(stack: Stack, keep_torch: str | None = None) -> list[str]:
    """The pins of ``stack`` this Python doesn't meet, and what it should remove but has: [] when it is installed."""
    from packaging.requirements import Requirement

    unmet = []
    for text in stack.requirements(keep_torch):
        pin = Requirement(text)
        version = installed(pin.name)
        if version is None or not pin.specifier.contains(version, prereleases=True):
            unmet.append(text)
    return unmet + [f"-{name}" for name in stack.uninstalls if installed(name)]
