"""The package as a user meets it: importing it is light, its settings are read in one place and documented, and
what it starts stops when Python exits."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from agentenv_nb import settings

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=ROOT)


@pytest.mark.slow  # a fresh interpreter
def test_importing_the_package_and_agentenv_imports_neither_torch_nor_unsloth():
    done = run_python("""
        import sys
        import agentenv_nb
        from agentenv_nb import AgentEnv
        import agentenv_nb.envs.serve.command, agentenv_nb.envs.process.sandbox, agentenv_nb.tasks.bundles
        print(sorted(m for m in ("torch", "unsloth", "transformers", "trl") if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # a fresh interpreter
def test_a_server_goes_without_openenvs_gradio_web_ui_and_gradio_still_imports_after():
    """OpenEnv's server package imports its Gradio web UI where Gradio imports, seconds of CPU in each server
    process; the kit serves no web UI, so it imports agent_env's build_app with Gradio hidden, which OpenEnv takes as
    Gradio not installed. A user's own ``import gradio`` works as before."""
    done = run_python("""
        import sys
        from agentenv_nb.envs import app
        app.openenv_build_app()
        from openenv.core import env_server
        print("gradio" in sys.modules, env_server.create_web_interface_app)
        import gradio
        print(gradio.__name__)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None", "gradio"]


def test_the_gpu_install_pins_every_dependency_of_the_package():
    """Colab installs requirements-gpu.txt, then the kit with --no-deps: a dependency missing there is an ImportError
    in the notebook."""
    import tomllib

    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [Requirement(line) for line in (ROOT / "requirements-gpu.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    name = lambda text: text.lower().replace("_", "-")  # noqa: E731
    missing = {name(Requirement(d).name) for d in declared} - {name(r.name) for r in pinned}
    assert not missing, f"requirements-gpu.txt lacks {sorted(missing)}"
    assert all(str(r.specifier).startswith("==") for r in pinned), "requirements-gpu.txt pins exactly"


def test_settings_come_from_arguments_then_the_environment_then_defaults(monkeypatch):
    assert settings.get("call_timeout") == 120.0
    monkeypatch.setenv("AGENTENV_NB_CALL_TIMEOUT", "7.5")
    assert settings.get("call_timeout") == 7.5
    assert settings.get("call_timeout", 3) == 3
    monkeypatch.setenv("AGENTENV_NB_PIP_INSTALL", "yes")
    assert settings.get("pip_install") is True


@pytest.mark.parametrize("name, value, says", [
    ("PORT", "abc", "AGENTENV_NB_PORT='abc' isn't a whole number"),
    ("PORT", "70000", "out of range: port takes a value from 0 to 65535"),
    ("MAX_CONCURRENT_ENVS", "0", "out of range: max_concurrent_envs takes a value from 1 to 4096"),
    ("PATIENCE", "nan", "AGENTENV_NB_PATIENCE='nan' isn't a finite number"),
    ("ENV_POOL", "100000", "out of range: env_pool takes a value from 0 to 64"),
    ("WORK_DIR", "relative/dir", "isn't an absolute path"),
    ("WORK_DIR", "/proc/agentenv", "is under /proc"),
    ("HOST", "abc", "AGENTENV_NB_HOST='abc' isn't an IP address or a name this machine resolves"),
    ("PIP_INSTALL", "maybe", "isn't a yes or no"),
])
def test_a_bad_setting_says_which_variable_and_what_it_takes(monkeypatch, name, value, says):
    monkeypatch.setenv(f"AGENTENV_NB_{name}", value)
    with pytest.raises(settings.SettingError, match=says.replace("(", r"\(")):
        settings.get(name.lower())


def test_the_readme_lists_every_setting():
    readme = (ROOT / "README.md").read_text()
    assert [s.variable for s in settings.SETTINGS.values() if f"`{s.variable}`" not in readme] == []


@pytest.mark.slow  # a fresh interpreter serves and exits
def test_no_env_process_or_folder_outlives_python_when_nothing_was_closed(tmp_path):
    """An episode left open, its AgentEnv and server never closed: the exit hook stops them all."""
    work = tmp_path / "work"
    done = run_python(f"""
        import json

        from agentenv_nb import AgentEnv
        from agentenv_nb.tasks.gridsim import write_bundle

        env = AgentEnv.local(write_bundle({str(tmp_path / "gridsim")!r}, train=2, eval=1), sandbox="process")
        play = env.factory()
        play.reset(**env.dataset[0])
        print(len(json.loads(play.get_prices())))
    """, AGENTENV_NB_WORK_DIR=str(work), AGENTENV_NB_ENV_POOL="2", XDG_STATE_HOME=str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "24"  # the episode played: the day's hourly prices, from its env
    assert sorted(work.iterdir()) == []
    assert [p.pid for p in psutil.process_iter(["cmdline", "cwd"]) if str(work) in f"{p.info['cwd']} {p.info['cmdline']}"] == []
