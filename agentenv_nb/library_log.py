"""What the libraries write to stderr while the kit loads, trains, plays and saves (Unsloth's banner, vLLM's CUDA-graph
bars, transformers' notices) kept in one log file instead of a notebook's cells, where each would show as an error
would; a line on stdout says how many lines went there, and a failure shows the last of them. What they print to
stdout goes there too (Unsloth's, a line at every generation from 16-bit weights), while what the kit and the user's
code print stays. In a notebook, what they display goes there too (as text): tqdm draws their progress bars there as
widgets (vLLM's weight loading, transformers' GGUF reading), which a saved notebook reopens as "Error displaying
widget".

    with to_log("loading the model"):     # "agentenv_nb: the libraries wrote 12 lines while loading the model, in ..."
        model = FastLanguageModel.from_pretrained(...)

The file is ``AGENTENV_NB_LIBRARY_LOG`` (default ``agentenv_nb.log`` in the working folder), appended to.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from pathlib import Path

from agentenv_nb import settings

SHOWN_ON_FAILURE = 20  # lines of the log a failure prints before its traceback
# The packages whose prints go to the log: the training stack's, and tqdm's, whose write() prints for them (the
# trainer's metrics under its bar in a console); the kit draws no tqdm bar
LIBRARIES = ("unsloth", "unsloth_zoo", "vllm", "trl", "transformers", "peft", "accelerate", "bitsandbytes", "torch",
             "datasets", "huggingface_hub", "agent_env", "tqdm")
# Unsloth's rewrites of TRL's trainers and configs are modules of their own, named "Unsloth" and TRL's class
# (UnslothGRPOTrainer, UnslothSFTTrainer), which unsloth_zoo's compiler runs from its cache folder
COMPILED_BY_UNSLOTH = "Unsloth"


def _from_a_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES or module.startswith(COMPILED_BY_UNSLOTH)


class _LogWhileOpen(io.TextIOBase):
    """The library log as a stream while a block runs, then whatever ``sys.stderr`` is (the console, or a later
    block's log). A library may keep the stream it found: Unsloth wraps ``sys.stderr`` in a filter as it imports, and a
    logging handler made inside the block holds that filter; past the block it must not write to a closed file."""

    def __init__(self, log):
        self.log = log

    @property
    def _target(self):
        if not self.log.closed:
            return self.log
        return sys.stderr if sys.stderr is not self else sys.__stderr__

    def write(self, text: str) -> int:
        return self._target.write(text)

    def flush(self) -> None:
        self._target.flush()

    @property
    def encoding(self) -> str:
        return self._target.encoding

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()


class _LibraryPrints(io.TextIOBase):
    """stdout for a block: what the libraries' code (``LIBRARIES``, Unsloth's compiled trainers) writes goes to ``log``;
    anything else's to ``console``."""

    def __init__(self, console, log):
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        # print() writes from the caller's frame: the module that printed
        module = sys._getframe(1).f_globals.get("__name__") or ""
        return (self.log if _from_a_library(module) else self.console).write(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()  # the log while its block runs, then sys.stderr (_LogWhileOpen)

    # as the console, to code that asks (tqdm, a subprocess given sys.stdout)
    @property
    def encoding(self) -> str:
        return self.console.encoding

    def isatty(self) -> bool:
        return self.console.isatty()

    def fileno(self) -> int:
        # a notebook kernel's stdout has no descriptor, and vLLM's engine start asks for one: the log's then
        try:
            return self.console.fileno()
        except (io.UnsupportedOperation, AttributeError, ValueError):
            return self.log.fileno()


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(), *(found for found in logging.Logger.manager.loggerDict.values()
                                      if isinstance(found, logging.Logger))]
    # A handler whose stream is a property (logging's last resort) writes to whatever sys.stderr is at the time
    return [handler for found in loggers for handler in found.handlers if isinstance(handler, logging.StreamHandler)
            and not isinstance(getattr(type(handler), "stream", None), property)]


def _written_since(path: Path, start: int) -> str:
    with path.open("rb") as log:  # from ``start`` only: the file holds every earlier block of the run too
        log.seek(start)
        return log.read().decode("utf-8", errors="replace")


def _displays_held():
    """In an IPython shell, a block whose displays are held back (``.outputs``) instead of shown in the cell."""
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:
        return contextlib.nullcontext()
    from IPython.utils.capture import capture_output

    return capture_output(stdout=False, stderr=False, display=True)


@contextlib.contextmanager
def to_log(what: str, keep_displays: bool = False):
    """Send stderr, and every logging handler writing to it, to the library log while the block runs (``what``
    names it in the log and the summary line); transformers' progress bars are off, and in a notebook what the block
    displays goes to the log as text, unless ``keep_displays`` (a block showing the kit's own progress or plot)."""
    # transformers' bars where it is imported: not imported here for the block that imports Unsloth, which must come
    # before transformers (and importing draws no bars)
    transformers_logging = sys.modules.get("transformers.utils.logging")
    bars_were_on = transformers_logging is not None and transformers_logging.is_progress_bar_enabled()
    if bars_were_on:
        transformers_logging.disable_progress_bar()
    path = Path(settings.get("library_log"))
    path.parent.mkdir(parents=True, exist_ok=True)
    consoles = (sys.stderr, sys.__stderr__)
    with path.open("a", encoding="utf-8") as file:
        file.write(f"--- {what}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        file.flush()
        start = file.tell()
        log = _LogWhileOpen(file)
        moved = {handler: handler.stream for handler in _stream_handlers() if handler.stream in consoles}
        for handler in moved:
            handler.setStream(log)
        held, displayed = (contextlib.nullcontext() if keep_displays else _displays_held()), None
        try:
            with contextlib.redirect_stderr(log), contextlib.redirect_stdout(_LibraryPrints(sys.stdout, log)), \
                    held as displayed:
                yield
        except Exception:
            log.flush()
            lines = _written_since(path, start).splitlines()[-SHOWN_ON_FAILURE:]
            print(f"agentenv_nb: the libraries' last lines while {what}, from {path}:", *lines, sep="\n",
                  file=sys.stderr)
            raise
        finally:
            for handler in _stream_handlers():  # those made inside the block too (a library imported there)
                if handler.stream is log:
                    handler.setStream(moved.get(handler, sys.stderr))
            if bars_were_on:
                transformers_logging.enable_progress_bar()
            for output in getattr(displayed, "outputs", ()):
                log.write(output.data.get("text/plain", "a display with no text").rstrip("\n") + "\n")
        log.flush()
        written = _written_since(path, start).count("\n")
    if written:
        print(f"agentenv_nb: the libraries wrote {written} line{'' if written == 1 else 's'} while {what}, in {path}")
