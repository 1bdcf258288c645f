"""What the libraries write to stderr while the kit loads, trains and saves goes to the library log, not to a
notebook's cells, and what they print to stdout too; the kit's own stdout stays, a failure shows the log's last lines,
and stderr and stdout are whole again afterwards. Each case
runs in a fresh Python, as a notebook's kernel or the training command starts, with the real transformers and tqdm."""

import subprocess
import sys
import textwrap

import pytest

from .conftest import STARTED_WITH, unsloth_lines

# A notebook's kernel has no CI variable; with CI set, transformers' loggers also propagate to the root logger (its
# logging.py), where Unsloth's import put a handler of its own: each notice would be logged twice
AS_A_KERNEL_HAS_IT = {name: value for name, value in STARTED_WITH.items() if name != "CI"}

LIBRARIES = """
import logging, warnings
from tqdm import tqdm
from transformers.utils import logging as transformers_logging
from agentenv_nb.library_log import to_log
library = transformers_logging.get_logger("transformers.trainer")
"""


def run(tmp_path, body: str) -> subprocess.CompletedProcess:
    log = tmp_path / "library.log"
    # A script file, as a notebook's cell has its source: a warning shows its line on every Python (3.13 finds a
    # `python -c` line too, 3.11 doesn't)
    script = tmp_path / "script.py"
    script.write_text(LIBRARIES + textwrap.dedent(body))
    # The environment the test session started with, as a fresh kernel's: an earlier test's Unsloth import sets
    # variables that huggingface_hub warns about on stderr
    return subprocess.run([sys.executable, script], capture_output=True, text=True,
                          env={**STARTED_WITH, "AGENTENV_NB_LIBRARY_LOG": str(log)}, cwd=tmp_path, timeout=120)


def test_library_output_goes_to_the_log_and_one_line_says_so_where(tmp_path):
    shown = run(tmp_path, """
        import peft, torch
        lora = peft.get_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), peft.LoraConfig(target_modules=["0"]))
        late = logging.getLogger("imported_inside")
        with to_log("training"):
            library.warning("a notice from transformers")
            for _ in tqdm(range(3), desc="a progress bar"):
                pass
            tqdm.write("{'loss': '0.1'}")  # what transformers' console bar writes under itself at each log
            warnings.warn("a Python warning")
            late.addHandler(logging.StreamHandler())  # a library imported inside the block makes its handler there
            late.warning("from a handler made inside")
            print("the kit's own line")
            lora.print_trainable_parameters()  # a library's print (PEFT's), as Unsloth prints at each 16-bit generation
        library.warning("transformers after the block")
        lora.print_trainable_parameters()
        late.warning("the handler made inside, after the block")
        with to_log("saving the model"):  # writes nothing: no line
            assert not transformers_logging.is_progress_bar_enabled()  # widgets in a notebook, unsaved with it
        assert transformers_logging.is_progress_bar_enabled()
    """)
    log = tmp_path / "library.log"
    assert shown.returncode == 0, shown.stderr
    trainable = "trainable params: 64 || all params: 84 || trainable%: 76.1905"
    assert shown.stdout.splitlines() == ["the kit's own line",
                                         f"agentenv_nb: the libraries wrote 7 lines while training, in {log}",
                                         trainable]
    # after what importing PEFT may write (torchao's notices where it is installed), before the block
    assert shown.stderr.splitlines()[-2:] == ["[transformers] transformers after the block",
                                              "the handler made inside, after the block"]
    kept = log.read_text()
    for line in ("--- training", "a notice from transformers", "a progress bar", "{'loss': '0.1'}", "a Python warning",
                 "from a handler made inside", trainable):
        assert line in kept
    assert "after the block" not in kept


@pytest.mark.slow  # a fresh Python imports Unsloth
def test_what_unsloth_prints_as_the_kit_imports_it_goes_to_the_log(tmp_path):
    """Unsloth prints as it imports: on a GPU its banner ("🦥 Unsloth: Will patch your computer ...") and unsloth_zoo's,
    on a CPU its fallback's line ("Unsloth 2026.10.9: no GPU found ..."). A notebook's preflight cell imports it
    through the kit and shows one line saying where they went."""
    log = tmp_path / "library.log"
    # Unsloth wraps the stderr it finds (the log) in a filter, and transformers' handler, made as Unsloth imports it,
    # keeps that filter: a notice past the block goes where stderr goes, one in a later block to that block's log
    shown = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from agentenv_nb.stack import import_unsloth
        import_unsloth()
        from agentenv_nb.library_log import to_log
        from transformers.utils import logging
        logging.get_logger("transformers.trainer").warning("a notice between blocks")
        with to_log("loading the model"):
            logging.get_logger("transformers.trainer").warning("a notice while loading")
    """)], capture_output=True, text=True, env={**AS_A_KERNEL_HAS_IT, "AGENTENV_NB_LIBRARY_LOG": str(log)},
                           cwd=tmp_path, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert unsloth_lines(shown.stdout + shown.stderr) == [], shown.stdout + shown.stderr
    said = shown.stdout.splitlines()
    assert said[0].startswith("agentenv_nb: the libraries wrote ")
    assert said[0].endswith(f" while importing Unsloth, in {log}")
    assert said[1:] == [f"agentenv_nb: the libraries wrote 1 line while loading the model, in {log}"]
    assert "Logging error" not in shown.stderr and shown.stderr.splitlines()[-1] == \
        "[transformers] a notice between blocks", shown.stderr
    kept = log.read_text()
    assert unsloth_lines(kept) and "a notice while loading" in kept and "between blocks" not in kept, kept


def test_what_unsloths_compiled_trainers_print_goes_to_the_log(tmp_path):
    """Unsloth rewrites TRL's trainers and configs into modules of their own (UnslothGRPOTrainer, ...), which
    unsloth_zoo's compiler runs from its cache folder; their notes on a config ("The Dr GRPO paper recommends ...") and
    on a dataset ("We found double BOS tokens ...") are the library's, not the kit's. The module is run here as that
    compiler runs it (tests/test_pinned_internals.py checks it still does)."""
    cache = tmp_path / "unsloth_compiled_cache"
    cache.mkdir()
    (cache / "UnslothSFTTrainer.py").write_text(
        "def prepare(): print('Unsloth: We found double BOS tokens - we shall remove one automatically.')\n")
    shown = run(tmp_path, """
        import importlib.util, sys
        location = "unsloth_compiled_cache/UnslothSFTTrainer.py"
        spec = importlib.util.spec_from_file_location("UnslothSFTTrainer", location)
        compiled = importlib.util.module_from_spec(spec)
        sys.modules["UnslothSFTTrainer"] = compiled
        exec(compile(open(location).read(), location, "exec"), compiled.__dict__)
        with to_log("training"):
            compiled.prepare()
            print("the kit's own line")
    """)
    assert shown.returncode == 0, shown.stderr
    log = tmp_path / "library.log"
    assert shown.stdout.splitlines() == ["the kit's own line",
                                         f"agentenv_nb: the libraries wrote 1 line while training, in {log}"]
    assert "We found double BOS tokens" in log.read_text()


def test_a_failure_shows_the_libraries_last_lines_and_still_raises(tmp_path):
    shown = run(tmp_path, """
        with to_log("loading the model"):
            library.warning("what led up to it")
            raise RuntimeError("out of memory")
    """)
    assert shown.returncode == 1
    lines = shown.stderr.splitlines()
    assert lines[:2] == [f"agentenv_nb: the libraries' last lines while loading the model, from "
                         f"{tmp_path / 'library.log'}:", "[transformers] what led up to it"]
    assert lines[-1] == "RuntimeError: out of memory"


@pytest.mark.slow  # a kernel
def test_in_a_notebook_a_librarys_progress_widget_goes_to_the_log_and_the_kits_own_displays_stay(tmp_path):
    """tqdm.auto draws a library's bar as a widget in a kernel (vLLM's weight loading, transformers' GGUF reading),
    which the saved notebook reopens as "Error displaying widget"; the block's summary line and the kit's own
    displays (a block that keeps them: its progress line, its live plot) stay in the cell."""
    import nbformat

    from agentenv_nb.notebook.demo import execute

    log = tmp_path / "library.log"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent("""
        from IPython.display import display
        from tqdm.auto import tqdm
        from agentenv_nb.library_log import to_log
        with to_log("loading the model"):
            for _ in tqdm(range(3), desc="Loading safetensors checkpoint shards"):
                pass
        with to_log("playing 3 task(s)", keep_displays=True):
            display("played 3 of 3 tasks")
    """))])
    execute(notebook, tmp_path, tmp_path / "kernel", 120, env={**STARTED_WITH, "AGENTENV_NB_LIBRARY_LOG": str(log)})
    outputs = notebook.cells[0].outputs
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})], outputs
    shown = [o.get("text") or o.data.get("text/plain") for o in outputs]
    assert shown == [f"agentenv_nb: the libraries wrote 1 line while loading the model, in {log}\n",
                     "'played 3 of 3 tasks'"], shown
    assert "Loading safetensors checkpoint shards" in log.read_text()


def test_a_kernels_stdout_without_a_descriptor_gives_the_logs_to_code_that_asks(tmp_path):
    # vLLM's engine start asks sys.stdout for its descriptor; a notebook kernel's stdout has none
    shown = run(tmp_path, """
        import io, os, sys
        sys.stdout = io.StringIO()
        with to_log("loading"):
            os.write(sys.stdout.fileno(), b"written to a descriptor\\n")
        sys.__stdout__.write("console: " + sys.stdout.getvalue())
    """)
    assert shown.returncode == 0, shown.stderr
    assert "written to a descriptor" in (tmp_path / "library.log").read_text()
    assert "descriptor" not in shown.stdout  # the kernel's stdout has the kit's line alone


def test_a_stream_a_library_keeps_from_the_block_goes_quietly(tmp_path):
    """A library may keep the stdout it found in the block (a handler, a console) and let it go after the log is
    closed: nothing shows (Python 3.13 reports a stream's failing flush as it is collected, in red under a cell)."""
    shown = run(tmp_path, """
        import sys
        with to_log("training"):
            kept = sys.stdout
            print("the kit's own line")
        del kept
    """)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert shown.stdout == "the kit's own line\n"
