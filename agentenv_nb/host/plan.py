"""What this host installs and how it trains, decided from one reading of it (``probe.Host``) and said in one line:
the package set (``stacks``), the preset, the engine that generates rollouts, and the precision.

    plan = plan_for(read_host())
    print(plan.line())      # the same line in the set-up cell, preflight, the notebooks and the command

Rules, in order: no GPU trains the tiny CPU preset; a driver older than CUDA 12.0, or a card older than compute
capability 7.0, gets no set and one line saying what to do; a card of 8.0 or newer (bf16) generates on Unsloth's vLLM,
keeping the runtime's torch where a vLLM release is built for it (``stacks.VLLM_FOR_TORCH``: a Colab L4 or A100 today),
else from the set its driver runs (CUDA 13.0: the pinned set; 12.x: CUDA-12 builds); an older card (a T4, a V100)
trains in fp16 on transformers' ``generate``, keeping the runtime's own torch where its driver runs it. A card of less
than 20 GB gets the "16gb" preset, others "24gb".
"""

from __future__ import annotations

import dataclasses
import functools

from agentenv_nb.host.probe import Host, version_text
from agentenv_nb.host.stacks import KEEP, STACKS, VLLM_FOR_TORCH, Stack, for_runtime_torch

VLLM_FROM = (8, 0)  # vLLM's recent builds need Ampere or newer on this stack's path (Unsloth pins an old one on T4s)
UNSLOTH_FROM = (7, 0)  # Unsloth's kernels: Volta and newer
CUDA_FROM = (12, 0)  # the oldest CUDA a known set is built for
TORCH_RANGE = ("2.4", "2.15")  # the torch Unsloth 2026.10.9 takes (its requirement: >=2.4.0,<2.15.0)
SMALL_CARD_GB = 20  # below: the "16gb" preset (a T4 shows 15 GB)


@dataclasses.dataclass(frozen=True)
class Plan:
    host: Host
    stack: Stack | None  # None: nothing fits; ``fix`` says what to do
    preset: str = "cpu-tiny"
    engine: str = "generate"  # "vllm": Unsloth's colocated vLLM; "generate": transformers'
    precision: str = "fp32"  # "bf16", "fp16" or "fp32" (the CPU)
    why: str = ""
    fix: str = ""

    @property
    def keep_torch(self) -> str | None:
        """The runtime's torch this plan keeps, or None."""
        return self.host.torch if self.stack is not None and self.stack.changes.get("torch") == KEEP else None

    def line(self) -> str:
        """The decision in one line: what is installed and why, and how it trains."""
        if self.stack is None:
            return f"agentenv_nb: {self.host.describe()}: {self.why}; {self.fix}"
        engine = "Unsloth's vLLM" if self.engine == "vllm" else "transformers' generate"
        return (f"agentenv_nb: {self.host.describe()} -> the '{self.stack.name}' set "
                f"({self.stack.describe(self.keep_torch)}), since "
                f"{self.why}; trains in {self.precision} on {engine} with the '{self.preset}' preset")


def runs_on_driver(cuda: tuple[int, int] | None, driver_cuda: tuple[int, int] | None) -> bool:
    """Whether a build for CUDA ``cuda`` runs on a driver of ``driver_cuda``: same major or older (minor-version
    compatibility within a major)."""
    return cuda is None or (driver_cuda is not None and cuda[0] <= driver_cuda[0])


def _torch_kept(host: Host) -> bool:
    """Whether the runtime's own torch can stay: a build this driver runs, in the range Unsloth takes."""
    from packaging.version import Version

    if host.torch is None:
        return False
    version = Version(host.torch).release
    low, high = (Version(bound).release for bound in TORCH_RANGE)
    return low <= version < high and (not host.gpus or (host.torch_cuda is not None and
                                                         runs_on_driver(host.torch_cuda, host.driver_cuda)))


def preset_for(host: Host) -> str:
    """The preset that fits this host's first GPU."""
    if host.gpu is None:
        return "cpu-tiny"
    return "16gb" if host.gpu.memory_gb < SMALL_CARD_GB else "24gb"


def precision_for(host: Host) -> str:
    """The precision a GPU preset trains in here: bf16 where the card computes in it, fp16 on an older card; with no
    GPU to ask, bf16, as on the card a GPU preset is made for."""
    return "fp16" if host.gpu is not None and not host.gpu.bf16 else "bf16"


def engine_for(host: Host, vllm_loads) -> tuple[bool, str]:
    """Whether rollouts generate on Unsloth's vLLM here, and why not: a card older than 8.0, or a vLLM that doesn't
    load (``vllm_loads()``: (ok, why), called only where the card allows it)."""
    if host.gpu is not None and host.gpu.capability < VLLM_FROM:
        return False, (f"{host.gpu.name} has compute capability {version_text(host.gpu.capability)}; these sets' vLLM "
                       f"needs {version_text(VLLM_FROM)}")
    return vllm_loads()


@functools.cache
def say_plan() -> Plan:
    """This machine's plan, said in one line once a process (the command, a notebook's "auto" preset)."""
    plan = plan_here()
    print(plan.line(), flush=True)
    return plan


def plan_here() -> Plan:
    """This machine's plan, read once; with AGENTENV_NB_STACK naming another known set, that set (what a user or a
    test machine installs by hand), generating on vLLM only where that set has it."""
    from agentenv_nb import settings
    from agentenv_nb.host.probe import read_host

    plan = plan_for(read_host())
    name = settings.get("stack")
    if not name or (plan.stack is not None and plan.stack.name == name):
        return plan
    if name not in STACKS:
        raise settings.SettingError(f"{settings.SETTINGS['stack'].variable}={name!r} isn't one of "
                                    f"{', '.join(STACKS)} ({settings.SETTINGS['stack'].what})")
    return with_stack(plan, STACKS[name], "AGENTENV_NB_STACK names it")


def with_stack(plan: Plan, stack: Stack, why: str) -> Plan:
    """``plan`` installing ``stack`` instead, as a user names it; generating on vLLM only where that set has it."""
    return dataclasses.replace(plan, stack=stack, engine=plan.engine if stack.vllm else "generate", why=why, fix="")


def plan_for(host: Host) -> Plan:
    """The set, preset, engine and precision for ``host``, with why."""
    gpu = host.gpu
    if gpu is None:
        if _torch_kept(host):
            return Plan(host, STACKS["runtime"], why="no GPU: the runtime's torch serves the CPU preset")
        return Plan(host, STACKS["cpu"], why="no GPU, and no torch of Unsloth's range here")
    if host.driver_cuda is None or host.driver_cuda < CUDA_FROM:
        return Plan(host, None, why=f"this driver runs CUDA {version_text(host.driver_cuda)}, older than every known set "
                                    f"(CUDA {CUDA_FROM[0]}.{CUDA_FROM[1]} or newer)",
                    fix="update the NVIDIA driver to the 525 branch or newer (580+ for the CUDA-13 set); on a "
                        "notebook host, pick another GPU runtime")
    if gpu.capability < UNSLOTH_FROM:
        return Plan(host, None, why=f"{gpu.name} has compute capability {version_text(gpu.capability)}: today's torch "
                                    f"builds have no kernels for it, and Unsloth needs {version_text(UNSLOTH_FROM)} or "
                                    "newer",
                    fix="pick a T4 or newer GPU (Kaggle: Settings -> Accelerator -> GPU T4 x2)")
    by_driver = STACKS["cuda13"] if host.driver_cuda >= STACKS["cuda13"].cuda else STACKS["cuda12"]
    preset = preset_for(host)
    if gpu.capability >= VLLM_FROM:
        if (keeping := for_runtime_torch(host.torch, host.torch_cuda)) and _torch_kept(host):
            vllm = VLLM_FOR_TORCH[keeping.keeps_torch]
            return Plan(host, keeping, preset, "vllm", "bf16",
                        f"vLLM {vllm} is built for its torch {host.torch}, which runs on this driver: the runtime's "
                        "torch stays, and nothing of it (torch, triton, NCCL, cuDNN) is downloaded again")
        why = f"its driver runs CUDA {version_text(host.driver_cuda)}" + (
            "" if by_driver.name == "cuda13" else ", and vLLM's CUDA-13 wheels (0.20.0 on) need CUDA 13")
        return Plan(host, by_driver, preset, "vllm", "bf16", why)
    no_bf16 = f"{gpu.name} (compute capability {version_text(gpu.capability)}) has no bf16 and no vLLM build of these sets"
    if _torch_kept(host):
        return Plan(host, STACKS["runtime"], preset, "generate", "fp16",
                    f"{no_bf16}, and its own torch {host.torch} runs on this driver")
    return Plan(host, by_driver.without_vllm(), preset, "generate", "fp16",
                f"{no_bf16}, and its driver runs CUDA {version_text(host.driver_cuda)}")
