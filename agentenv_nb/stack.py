"""Import the trainer stack in the order it needs, on a GPU or a plain CPU.

Unsloth must be imported before TRL so it can rewrite TRL's trainers (on a GPU), or patch TRL
1.15's fused LM head so it runs at all (on a CPU). A torchvision wheel whose compiled operators don't match the
installed torch (seen: PyPI's torchvision 0.28.0 beside torch 2.13.0+cpu) breaks ``from transformers import
PreTrainedModel`` and ``import unsloth``; it is hidden first, here, the one place that works around it.

Usage::

    from agentenv_nb.stack import import_unsloth, vllm_available

    unsloth = import_unsloth()          # before anything imports trl
    ok, why = vllm_available()          # colocated vLLM (fast_inference) only when ok
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

from agentenv_nb.library_log import to_log


# Warnings that importing the stack (transformers, unsloth) logs on every healthy run, by logger: a notebook shows each
# as a pink block. Set before anything imports them; each logger's errors still show.
_IMPORT_NOTICES = {
    "torch.utils._pytree": "torchao's enums registered with the deprecated register_constant()",
    "torchao": "its optional compiled kernels (_C_cutlass_*.so) that do not load for every torch build; unused here",
    "bitsandbytes.backends.cpu.ops": "an optional CPU 4-bit kernel (the `kernels` package); no CPU preset runs 4-bit",
}
for _name in _IMPORT_NOTICES:
    logging.getLogger(_name).setLevel(logging.ERROR)
# TRL warns at every GRPOTrainer built with environment_factory that the API is experimental: the kit is built on it,
# with trl pinned (1.15.0), and its tests fail when it changes
warnings.filterwarnings("ignore", message="You are using 'environment_factory'", category=UserWarning)
# and at every import of trl.experimental, where its AsyncGRPOTrainer is (the async trainer, pinned the same way)
warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'", category=UserWarning)


def hide_broken_torchvision() -> str | None:
    """Hide torchvision from this process when its compiled ops don't load, as if not installed; return why, else
    None. transformers imports torchvision whenever it is installed, and text models never need it."""
    if sys.modules.get("torchvision", False) is None or importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision.ops  # noqa: F401  where the compiled nms lives
    except RuntimeError as error:  # e.g. "operator torchvision::nms does not exist"
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # find_spec() then says "not installed"; import raises
        return f"torchvision hidden: its compiled operators don't load ({error})"
    return None


def import_unsloth() -> ModuleType:
    """Import unsloth (once, first), after hiding a broken torchvision; return the module. What Unsloth prints as it
    imports (its banner on a GPU, its CPU fallback's line on a CPU) goes to the library log (``library_log``).

    Warns if trl came first: classes taken from trl before then stay unpatched (Unsloth warns on a GPU too).
    """
    if "unsloth" in sys.modules:
        return sys.modules["unsloth"]
    if "trl" in sys.modules:
        warnings.warn("trl was imported before unsloth; call import_unsloth() before anything imports trl")
    # vLLM logs to stdout by default, where its dozens of INFO lines a load would fill a notebook's cell; on stderr
    # they go to the library log with the other libraries' output (``library_log``)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    reason = hide_broken_torchvision()
    if reason:
        print(f"agentenv_nb: {reason}")
    with to_log("importing Unsloth"):
        return importlib.import_module("unsloth")


@functools.cache
def vllm_available() -> tuple[bool, str]:
    """Whether Unsloth's colocated vLLM (fast_inference=True) can run here, and why not if not: vLLM installed, a
    CUDA GPU visible, and every compiled extension it ships loading beside this torch."""
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed"
    import torch

    if not torch.cuda.is_available():
        return False, "vllm needs a CUDA GPU and none is visible"
    if problem := vllm_load_problem():
        return False, problem
    return True, "vllm and its compiled extensions load, and a CUDA GPU is visible"


def vllm_load_problem() -> str | None:
    """Why the installed vLLM doesn't load beside this torch, or None. ``import vllm`` loads none of its compiled
    extensions, so a build for another CUDA or torch imports and fails later, inside Unsloth's load: each extension it
    ships beside its ``__init__`` (_C, _moe_C, ...) is loaded here, as Unsloth's own guard does since
    unslothai/unsloth#6621."""
    import torch

    try:
        folder = Path(importlib.import_module("vllm").__file__).parent
        for extension in sorted(folder.glob("*.so")):
            importlib.import_module(f"vllm.{extension.name.split('.')[0]}")
    except Exception as error:  # a vllm built for another CUDA or torch fails in many ways
        return (f"vllm {importlib.metadata.version('vllm')} doesn't load here ({type(error).__name__}: {error}): it is "
                f"built for another CUDA or torch than torch {torch.__version__}")
    return None
