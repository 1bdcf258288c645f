"""nbval runs the notebooks on the tiny bundle and model, on CPU, in the tiny run's fewer steps (``params.QUICK``),
all four writing under one temporary run folder, so each picks up what the one before it made. A cell that writes to
stderr fails, as it fails the browser test: a user would see it in red under the cell."""

import tempfile

import pytest

from agentenv_nb.notebook.params import use_tiny_defaults

run_folder = tempfile.TemporaryDirectory(prefix="agentenv_nb-notebooks-")
use_tiny_defaults(run_folder.name, quick=True)


def pytest_unconfigure(config):
    run_folder.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if item.path.suffix == ".ipynb":
        # nbval's cell item keeps what the kernel sent back for the cell; without it, nbval changed and nothing here
        # would see stderr any more
        assert hasattr(item, "test_outputs"), "nbval's cell item has no test_outputs: update notebooks/conftest.py"
        noise = [out.text for out in item.test_outputs or () if out.get("name") == "stderr"]
        if noise:
            pytest.fail(f"{item.name} writes to stderr:\n{''.join(noise)[:2000]}", pytrace=False)
    return result
