"""Where envs run and the preflight, on this machine: no Docker engine, no Modal account, no GPU.

Modal credentials are read from a scratch HOME and the environment, and checked where agent_env's Modal sandbox
reads them. The Docker probe talks to a small real HTTP server on a unix socket or loopback that answers ``/_ping``
as an engine does, and to a socket nobody listens on. Colab's secrets come from a stand-in ``google.colab`` package
on a subprocess's path, since the real one exists only on Colab. The preflight runs on deliberately broken setups.
"""

import http.server
import os
import socketserver
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from .conftest import free_port

from agentenv_nb.notebook import preflight as pf
from agentenv_nb.envs import choice as sandboxes
from agentenv_nb.envs import modal_credentials
from agentenv_nb.envs.process import sandbox as process_sandbox
from agentenv_nb.envs.choice import SandboxError, choose_sandbox
from agentenv_nb.train import presets
from agentenv_nb.train.presets import PRESETS, choices

AGENT_ENV_EXAMPLES = Path(__import__("agent_env").__file__).parent / "examples"


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No Modal token anywhere: its variables cleared (and restored after, whatever the test loads into them), HOME
    an empty folder, nothing forced, and DOCKER_HOST a socket nobody listens on."""
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_CONFIG_PATH", "MODAL_PROFILE",
                 "AGENT_ENV_MODAL_APP_NAME", "AGENTENV_NB_SANDBOX", "DOCKER_TLS_VERIFY"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    return home


class _Ping(http.server.BaseHTTPRequestHandler):
    """What a Docker engine answers to ``GET /_ping``."""

    def do_GET(self):
        ok = self.path == "/_ping"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"not found")

    def log_message(self, *args):
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def docker_socket(tmp_path):
    """A unix socket that answers /_ping as a Docker engine's does."""
    path = tmp_path / "docker.sock"
    server = _UnixServer(str(path), _Ping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"unix://{path}"
    server.shutdown()
    server.server_close()


def _plain_python_bundle(root: Path) -> Path:
    """A bundle with one env that the process sandbox can run: a server env.toml and a plain-Python Dockerfile."""
    env = root / "envs" / "echo"
    env.mkdir(parents=True)
    (env / "env.toml").write_text('env_provider_type = "server"\n')
    (env / "requirements.txt").write_text("mcp>=1.25,<2\n")
    (env / "server.py").write_text("print('an MCP server')\n")
    (env / "Dockerfile").write_text(textwrap.dedent("""\
        FROM python:3.11-slim
        WORKDIR /app
        COPY requirements.txt .
        RUN pip install --no-cache-dir -r requirements.txt
        COPY server.py .
        CMD ["python", "server.py"]
        """))
    return root


# Modal credentials

def test_without_credentials_the_message_says_how_to_make_a_token_and_where_to_put_it(clean_env):
    assert modal_credentials.find_modal_credentials() is None
    assert modal_credentials.load_modal_credentials(required=False) is None
    with pytest.raises(modal_credentials.ModalCredentialsError) as error:
        modal_credentials.load_modal_credentials()
    message = str(error.value)
    for needed in ("modal token new", "Settings -> API tokens", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET",
                   "~/.modal.toml", "Colab"):
        assert needed in message


def test_modal_toml_in_home_is_read_as_modal_picks_the_profile(clean_env, monkeypatch):
    (clean_env / ".modal.toml").write_text(textwrap.dedent("""\
        [other]
        token_id = "ak-other"
        token_secret = "as-other"
        [work]
        token_id = "ak-work"
        token_secret = "as-work"
        active = true
        """))
    found = modal_credentials.find_modal_credentials()
    assert (found.token_id, found.token_secret) == ("ak-work", "as-work")
    assert "[work]" in found.source and "as-work" not in repr(found)
    monkeypatch.setenv("MODAL_PROFILE", "other")
    assert modal_credentials.find_modal_credentials().token_id == "ak-other"


def test_loaded_credentials_and_app_name_are_what_agent_env_reads(clean_env):
    # A [default] profile that isn't marked active: Modal uses it, agent_env's own reader alone would not.
    (clean_env / ".modal.toml").write_text('[default]\ntoken_id = "ak-1"\ntoken_secret = "as-1"\n')
    found = modal_credentials.load_modal_credentials(app_name="gridsim-test")
    assert found.source.endswith("[default]")
    from agent_env.config import get_config
    from agent_env.providers.sandbox_providers.modal_sandbox import ModalSandboxProvider

    assert get_config().get_modal_credentials() == ("ak-1", "as-1")
    assert ModalSandboxProvider()._app_name == "gridsim-test"


def test_broken_modal_toml_says_how_to_write_it_again(clean_env):
    (clean_env / ".modal.toml").write_text("[default\ntoken_id = ")
    with pytest.raises(modal_credentials.ModalCredentialsError, match="modal token set"):
        modal_credentials.find_modal_credentials()


def test_colab_secrets_are_skipped_cleanly_off_colab_and_read_on_it(clean_env, tmp_path):
    assert modal_credentials.find_modal_credentials() is None  # no google.colab here: skipped, no error
    fake = tmp_path / "colab-standin" / "google" / "colab"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "userdata.py").write_text(textwrap.dedent("""\
        class SecretNotFoundError(Exception):
            pass
        SECRETS = {"MODAL_TOKEN_ID": "ak-colab", "MODAL_TOKEN_SECRET": "as-colab"}
        def get(key):
            if key not in SECRETS:
                raise SecretNotFoundError(key)
            return SECRETS[key]
        """))
    code = ("import os; from agentenv_nb.envs import modal_credentials; c = modal_credentials.load_modal_credentials(); "
            "print(c.source, os.environ['MODAL_TOKEN_ID'], os.environ['MODAL_TOKEN_SECRET'])")
    env = {**os.environ, "PYTHONPATH": str(fake.parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["Colab", "secrets", "ak-colab", "as-colab"], done.stderr


# The Docker probe and the sandbox choice

def test_docker_probe_dead_socket_live_socket_and_loopback(clean_env, docker_socket):
    ok, seen = sandboxes.docker_engine()
    assert not ok and "no Docker engine answers at unix://" in seen
    assert sandboxes.docker_engine(docker_socket) == (True, f"a Docker engine answers at {docker_socket}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert sandboxes.docker_engine(f"tcp://127.0.0.1:{server.server_port}")[0]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(Path("/var/run/docker.sock").exists(), reason="needs a machine without a Docker engine")
def test_without_docker_host_the_cli_is_asked_too(clean_env, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST")  # the CLI may know a context; here it finds no engine either
    ok, seen = sandboxes.docker_engine()
    assert not ok and ("`docker info`" in seen or "/var/run/docker.sock" in seen)


def test_docker_wins_where_an_engine_answers(clean_env, docker_socket, monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", docker_socket)
    choice = choose_sandbox(AGENT_ENV_EXAMPLES / "echo-mcp")
    assert choice.name == "local" and docker_socket in choice.reason
    assert f"envs run on local: a Docker engine answers at {docker_socket}" in capsys.readouterr().out


def test_modal_without_docker_when_credentials_exist(clean_env, monkeypatch):
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-env")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-env")
    choice = choose_sandbox(AGENT_ENV_EXAMPLES / "echo-mcp", echo=False)
    assert choice.name == "modal"
    assert "no Docker engine answers" in choice.reason and "environment variables" in choice.reason


def test_processes_without_docker_or_credentials_for_plain_python_envs(clean_env, tmp_path):
    choice = choose_sandbox(_plain_python_bundle(tmp_path / "bundle"), echo=False)
    assert choice.name == "process" and "plain-Python" in choice.reason
    assert choose_sandbox(tmp_path / "bundle", force="auto", echo=False) == choice  # the notebooks' SANDBOX="auto"


def test_nowhere_to_run_says_to_add_modal_credentials(clean_env):
    # The framework's own echo-mcp bundle: its env deploys behind a gateway, which needs Docker or a cloud sandbox.
    with pytest.raises(SandboxError) as error:
        choose_sandbox(AGENT_ENV_EXAMPLES / "echo-mcp")
    assert "echo: envs/echo/env.toml" in str(error.value) and "modal token new" in str(error.value)


def test_a_dockerfile_a_process_cant_be_is_named_by_line(clean_env, tmp_path):
    bundle = _plain_python_bundle(tmp_path / "bundle")
    dockerfile = bundle / "envs" / "echo" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("WORKDIR /app\n", "WORKDIR /app\nRUN apt-get update\n"))
    assert "line 3" in process_sandbox.problems(bundle)["echo"]


def test_forcing(clean_env, tmp_path, monkeypatch):
    bundle = _plain_python_bundle(tmp_path / "bundle")
    with pytest.raises(SandboxError, match="modal token new"):
        choose_sandbox(bundle, force="modal", echo=False)
    with pytest.raises(SandboxError, match="aren't plain-Python"):
        choose_sandbox(AGENT_ENV_EXAMPLES / "echo-mcp", force="process", echo=False)
    docker = choose_sandbox(bundle, force="local", echo=False)
    assert docker.name == "local" and "deploys will fail" in docker.reason
    monkeypatch.setenv("AGENTENV_NB_SANDBOX", "process")
    forced = sandboxes.Choice("process", "forced; every env is a plain-Python server")
    assert choose_sandbox(bundle, echo=False) == forced
    assert choose_sandbox(bundle, force="auto", echo=False) == forced  # "auto" forces nothing: the variable does


# The preflight on broken setups

@pytest.fixture(scope="module")
def grpo_config(tmp_path_factory):
    """A real GRPOConfig of the cpu-tiny preset (imports unsloth, then trl)."""
    return lambda **kw: presets.grpo_config("cpu-tiny", output_dir=str(tmp_path_factory.mktemp("grpo")), **kw)


def _statuses(rows) -> dict[str, str]:
    return {row["check"]: row["status"] for row in rows}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_no_gpu_fails_a_gpu_preset_with_a_fix():
    [row] = pf.check_gpu(PRESETS["24gb"])
    assert row["status"] == "fail" and "Change runtime type" in row["fix"]
    assert "needs about 13 GB" in row["detail"]  # no vLLM here: the 4-bit run generates 16 rollouts at a time
    assert presets.gpu_need_gb(PRESETS["16bit"]) == 25.0 and presets.gpu_need_gb(PRESETS["cpu-tiny"]) == 0.0
    assert pf.check_gpu(PRESETS["cpu-tiny"])[0]["status"] == "ok"


def test_an_l4_is_checked_for_the_weights_vllm_loads_and_not_again_once_the_model_holds_it(monkeypatch):
    """An L4 as torch would see it (no GPU here): free memory against the 16-bit need, or the 4-bit one where 4-bit
    weights are named; once the model is loaded (this process holds memory), what it holds, not a failure."""
    import torch

    free, reserved = [18 * 2**30], [0]
    for name, seen in {"is_available": lambda: True, "mem_get_info": lambda *_: (free[0], 22.5 * 2**30),
                       "get_device_name": lambda *_: "NVIDIA L4", "memory_reserved": lambda *_: reserved[0]}.items():
        monkeypatch.setattr(torch.cuda, name, seen)
    monkeypatch.setattr(choices, "fast_inference", lambda preset: True)  # vLLM, as on a GPU host
    [row] = pf.check_gpu(PRESETS["24gb"])
    assert row["status"] == "fail" and "18.0 of 22.5 GB free; the 24gb preset needs 21" in row["detail"]
    assert row["fix"].endswith("or 4-bit weights for vLLM, which need 17 GB (AGENTENV_NB_VLLM_WEIGHTS=4bit)")
    monkeypatch.setenv("AGENTENV_NB_VLLM_WEIGHTS", "4bit")
    assert pf.check_gpu(PRESETS["24gb"])[0]["status"] == "ok"
    free[0], reserved[0] = 5 * 2**30, 16 * 2**30  # notebook 03's second preflight, the model loaded
    [row] = pf.check_gpu(PRESETS["24gb"])
    assert row["status"] == "ok" and "this process holding 16.0 GB (the model)" in row["detail"]


@pytest.fixture
def pinned(tmp_path, monkeypatch):
    """requirements-gpu.txt as a file of the test's, written by ``pin(text)``: every known set reads it."""
    from agentenv_nb.host import stacks

    requirements = tmp_path / "requirements-gpu.txt"
    monkeypatch.setattr(stacks, "REQUIREMENTS", requirements)
    return requirements.write_text


def test_versions_against_the_hosts_set(pinned):
    pinned("# pins\ntrl==0.0.1\ntransformers==5.17.0\npandas==0.0.1\nno-such-package-xyz==1.0\n")
    rows = pf.check_versions(PRESETS["24gb"])
    assert _statuses(rows) == {"versions": "warn", "version trl": "fail", "version pandas": "warn",
                               "version no-such-package-xyz": "warn"}
    trl_row = next(row for row in rows if row["check"] == "version trl")
    assert "set pins trl==0.0.1" in trl_row["detail"] and "python -m agentenv_nb.host" in trl_row["fix"]
    cpu = pf.check_versions(PRESETS["cpu-tiny"])
    assert _statuses(cpu) == {"versions": "warn", "version trl": "fail"}  # pandas isn't the CPU path's
    assert "on the CPU only trl, transformers and unsloth matter" in cpu[0]["detail"]


def test_the_kits_own_pins_hold_on_the_cpu():
    assert all(row["status"] == "ok" for row in pf.check_versions(PRESETS["cpu-tiny"]))


@pytest.mark.slow
@pytest.mark.parametrize("imports, status", [("import trl", "fail"),
                                             ("from agentenv_nb.stack import import_unsloth; import_unsloth(); "
                                              "import trl", "ok")])
def test_import_order_in_a_fresh_process(imports, status):
    code = f"{imports}\nfrom agentenv_nb.notebook.preflight import check_import_order\nprint(check_import_order()[0]['status'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == status, done.stderr[-2000:]


def test_unreachable_server_says_how_to_start_one():
    port = free_port()
    [row] = pf.check_server(f"http://127.0.0.1:{port}", "train", timeout=2)
    assert row["status"] == "fail" and "no env server answers" in row["detail"]
    assert "python -m agentenv_nb.envs.serve" in row["fix"] and "--max-concurrent-envs 64" in row["fix"]
    assert f"--port {port} " in row["fix"]  # the port the URL names, not the default typed again


def test_thinking_on_with_a_small_budget_warns(grpo_config):
    thinking = grpo_config(chat_template_kwargs={"enable_thinking": True}, max_completion_length=1024)
    [row] = pf.check_thinking(thinking)
    assert row["status"] == "warn" and "6144" in row["detail"] and "enable_thinking" in row["fix"]
    assert pf.check_thinking(grpo_config())[0]["status"] == "ok"  # the presets turn thinking off
    assert pf.check_thinking(grpo_config(chat_template_kwargs={}, max_completion_length=8192))[0]["status"] == "ok"


def test_max_concurrent_envs_below_the_trainers_sessions(grpo_config):
    config = grpo_config()  # cpu-tiny: 8 rollouts a step, eval batch 4
    [row] = pf.check_capacity(config, 4)
    assert row["status"] == "fail" and "below the 8 sessions" in row["detail"]
    assert "--max-concurrent-envs 8" in row["fix"]
    assert pf.check_capacity(config, 8)[0]["status"] == "ok"
    assert pf.check_capacity(config, None)[0]["status"] == "warn"
    with pytest.warns(pf.CapacityWarning, match="CAPACITY_REACHED"):
        assert pf.capacity_warning(config, 4)
    assert pf.capacity_warning(config, 16) is None


@pytest.mark.slow  # two fresh interpreters import the stack
def test_hf_token_where_the_model_comes_from_the_hub(tmp_path):
    code = ("from agentenv_nb.notebook.preflight import check_hf; "
            "print(check_hf(None, 'unsloth/Qwen3-4B')[0]['status'], check_hf(None, '.'), check_hf(False, 'a/b'))")
    env = {key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["warn", "[]", "[]"], done.stderr[-2000:]
    env["HF_TOKEN"] = "hf_test"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[0] == "ok", done.stderr[-2000:]


def test_modal_sandbox_without_credentials_fails_with_the_how_to(clean_env):
    [row] = pf.check_modal(sandboxes.Choice("modal", "forced"))
    assert row["status"] == "fail" and "modal token new" in row["fix"]
    assert pf.check_modal("process") == []


def test_preflight_prints_a_line_per_problem_and_strict_raises(clean_env, grpo_config, capsys, pinned):
    pinned("trl==0.0.1\n")
    config = grpo_config(chat_template_kwargs={"enable_thinking": True})
    table = pf.preflight("cpu-tiny", env="http://127.0.0.1:9", trainer_args=config, max_concurrent_envs=2,
                         sandbox="modal")
    assert list(table.columns) == ["check", "status", "detail", "fix"]
    problems = table[table.status != "ok"]
    # Import order depends on what else this pytest process ran first; a fresh process tests it above.
    assert set(problems.check) - {"import order"} == {"versions", "version trl", "env server", "thinking", "sessions",
                                                      "modal"}
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(problems) + 1
    assert out[-1] == f"preflight: {len(table) - len(problems)} of {len(table)} checks ok"
    assert any(line.startswith("preflight: FAIL sessions:") and "-> fix:" in line for line in out)
    with pytest.raises(pf.PreflightError, match="FAIL env server"):
        pf.preflight("cpu-tiny", env="http://127.0.0.1:9", strict=True, show=False)


@pytest.mark.slow
def test_preflight_in_a_notebook_displays_the_table(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    requirements = tmp_path / "requirements-gpu.txt"
    requirements.write_text("trl==0.0.1\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"from pathlib import Path\nfrom agentenv_nb.host import stacks\nstacks.REQUIREMENTS = Path({str(requirements)!r})\n"
        "from agentenv_nb.notebook.preflight import preflight\n_ = preflight('cpu-tiny')")])
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()
    [output] = [out for out in notebook.cells[0].outputs if out.get("name") != "stderr"]  # the table, no printed lines
    html = output["data"]["text/html"]
    assert output["output_type"] == "display_data" and "<table" in html and "set pins trl==0.0.1" in html


def test_an_image_of_an_older_python_runs_quietly_and_of_a_newer_one_is_said(tmp_path, caplog):
    """Colab's Python 3.12 runs GridSim's python:3.11 image without a warning in every notebook that serves it."""
    import sys

    from agentenv_nb.envs.process.dockerfile import read_dockerfile

    major, minor = sys.version_info[:2]
    (tmp_path / "server.py").write_text("print('an MCP server')\n")
    for wanted in (f"{major}.{minor - 1}", f"{major}.{minor}", f"{major}.{minor + 1}"):
        (tmp_path / "Dockerfile").write_text(f'FROM python:{wanted}-slim\nCOPY server.py .\nCMD ["python", "server.py"]\n')
        read_dockerfile("Dockerfile", tmp_path, tmp_path / wanted)
    said = [r.getMessage() for r in caplog.records if "older Python" in r.getMessage()]
    assert len(said) == 1 and f"python:{major}.{minor + 1}-slim" in said[0]
