"""Bad input and faults as a new user meets them: each is one line that says what to do, at the first moment it can be
known (the serve command's arguments, a server's start, AgentEnv's construction, a tool call, the preflight), and
closing leaves no process or folder behind.

Everything is real: the serve command as a subprocess, servers on loopback, a plain HTTP server that isn't OpenEnv,
agent_env's own mail-mcp example bundle, GridSim episodes on the process sandbox. This machine has no Docker engine
and no Modal account, so the automatic choice is the process sandbox.
"""

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from .conftest import free_port

from agentenv_nb.client import AgentEnv
from agentenv_nb.envs.choice import SandboxError
from agentenv_nb.envs.process.dockerfile import ImageError
from agentenv_nb.envs.workdir import work_dir
from agentenv_nb.envs.serve.processes import serve_in_processes
from agentenv_nb.envs.serve.thread import serve_in_thread
from agentenv_nb.tasks import gridsim
from agentenv_nb.train.presets import PRESETS

MAIL_MCP = Path(__import__("agent_env").__file__).parent / "examples" / "mail-mcp"
SERVE = [sys.executable, "-m", "agentenv_nb.envs.serve"]


@pytest.fixture(autouse=True)
def nowhere_but_processes(tmp_path, monkeypatch):
    """No Docker engine (a socket nobody listens on), no Modal token, nothing forced, a small warm pool, and a work
    folder of this test's own, so what is left in it is this test's."""
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_PROFILE", "AGENTENV_NB_SANDBOX"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    monkeypatch.setenv("AGENTENV_NB_ENV_POOL", "2")
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(tmp_path / "work"))


def _gridsim(root: Path, dockerfile_line: str = "", requirement: str = "") -> Path:
    """A GridSim bundle (2 train days, 1 eval), its Dockerfile given one more line, its requirements one more."""
    bundle = gridsim.write_bundle(root, train=2, eval=1)
    env = bundle / "envs" / "gridsim"
    if dockerfile_line:
        text = (env / "Dockerfile").read_text()
        (env / "Dockerfile").write_text(text.replace("WORKDIR /app\n", f"WORKDIR /app\n{dockerfile_line}\n"))
    if requirement:
        (env / "requirements.txt").write_text((env / "requirements.txt").read_text() + requirement + "\n")
    return bundle


def _serve_fails(*args: str, env: dict | None = None, cwd=None) -> str:
    """Run the serve command, which must refuse: exit status 2 and one line on stderr, no traceback."""
    done = subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **(env or {})})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, (done.returncode, done.stderr)
    return lines[0]


# The serve command

@pytest.mark.parametrize("args, env, says", [
    (["--port", "70000"], {}, "--port='70000' is out of range: port takes a value from 0 to 65535"),
    (["--port", "-5"], {}, "--port='-5' is out of range"),
    ([], {"AGENTENV_NB_PORT": "abc"}, "AGENTENV_NB_PORT='abc' isn't a whole number"),
    (["--max-concurrent-envs", "0"], {}, "max_concurrent_envs takes a value from 1 to 4096"),
    (["--max-concurrent-envs", "-3"], {}, "--max-concurrent-envs='-3' is out of range"),
])
def test_a_bad_setting_is_one_line_before_anything_loads(tmp_path, args, env, says):
    line = _serve_fails(str(_gridsim(tmp_path / "bundle")), *args, env=env)
    assert says in line, line


@pytest.mark.slow  # the commands in fresh interpreters
def test_a_missing_or_unknown_bundle_is_one_line(tmp_path):
    line = _serve_fails(str(tmp_path / "no-bundle"))
    assert f"no bundle '{tmp_path / 'no-bundle'}': no such folder" in line and "gridsim-tiny" in line, line
    line = _serve_fails("no-such-bundle")
    assert "bundles.txt knows gridsim-v1, gridsim-offline, gridsim-tiny" in line, line


@pytest.mark.slow  # the serve command in fresh interpreters
def test_an_env_a_process_cannot_run_stops_the_command_as_it_starts(tmp_path):
    line = _serve_fails(str(_gridsim(tmp_path / "apt", dockerfile_line="RUN apt-get update")), "--sandbox", "process")
    assert "line 3: 'RUN apt-get update'" in line and "--sandbox local" in line, line
    line = _serve_fails(str(_gridsim(tmp_path / "missing", requirement="agentenv-nb-no-such-package>=1")))
    assert "-m pip install 'agentenv-nb-no-such-package>=1'" in line and "AGENTENV_NB_PIP_INSTALL=1" in line, line


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_a_bundle_named_in_bundles_txt_serves_from_the_command_and_agentenv_local(tmp_path, monkeypatch, capsys):
    port = free_port()
    with subprocess.Popen([*SERVE, "gridsim-tiny", "--bundle-dir", str(tmp_path / "bundles"), "--host", "127.0.0.1",
                           "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as server:
        try:
            for line in server.stdout:  # the choice of sandbox, then uvicorn's startup lines
                if "Uvicorn running" in line:  # listening; "Application startup complete" comes before the bind
                    break
            with AgentEnv(f"http://127.0.0.1:{port}") as env:
                assert len(env.tasks("train")) == 16 and env.max_concurrent_envs is None  # OpenEnv doesn't say
        finally:
            server.terminate()
    assert (tmp_path / "bundles" / "gridsim-tiny" / "tasks").is_dir()
    monkeypatch.chdir(tmp_path)  # AgentEnv.local fetches into ./bundles, as get_bundle does
    with AgentEnv.local("gridsim-tiny", max_concurrent_envs=4) as env:  # no sandbox named: chosen, and said
        assert len(env.tasks("eval")) == 8 and env.max_concurrent_envs == 4
    assert "agentenv_nb: envs run on process: no Docker engine answers" in capsys.readouterr().out


def test_docker_named_where_no_engine_answers_names_the_process_sandbox(tmp_path):
    from agentenv_nb.envs.choice import choose_sandbox

    choice = choose_sandbox(_gridsim(tmp_path / "gridsim"), force="local", echo=False)
    assert "deploys will fail" in choice.reason and "process sandbox runs them" in choice.reason, choice.reason




# Each way of serving checks every env as it starts

def test_every_way_of_serving_checks_the_envs_as_it_starts(tmp_path):
    apt = _gridsim(tmp_path / "apt", dockerfile_line="RUN apt-get update")
    missing = _gridsim(tmp_path / "missing", requirement="agentenv-nb-no-such-package>=1")
    with pytest.raises(SandboxError, match=r"line 3: 'RUN apt-get update'.*--sandbox local"):
        serve_in_thread(apt, sandbox="process")
    with pytest.raises(SandboxError, match="line 3: 'RUN apt-get update'"):  # the automatic choice finds no home
        AgentEnv.local(apt)
    with pytest.raises(ImageError, match=r"pip install 'agentenv-nb-no-such-package>=1'"):
        serve_in_processes(missing, 2)
    with pytest.raises(ImageError, match="agentenv-nb-no-such-package>=1 \\(requirements.txt line 3\\)"):
        AgentEnv.local(missing)
    assert not list(work_dir().iterdir())  # nothing started, nothing unpacked


def test_an_env_without_env_toml_is_refused_with_the_fix_and_runs_once_fixed(tmp_path):
    """agent_env's mail-mcp example: its env has no env.toml, so it deploys behind a gateway."""
    with pytest.raises(SandboxError, match='write envs/mail/env.toml with the line env_provider_type = "server"'):
        AgentEnv.local("mail-mcp")
    bundle = shutil.copytree(MAIL_MCP, tmp_path / "mail-mcp", ignore=shutil.ignore_patterns("__pycache__"))
    (bundle / "envs" / "mail" / "env.toml").write_text('env_provider_type = "server"\n')
    (bundle / "tasks" / "smoke.json").write_text(json.dumps([  # the example's task, with an agent to play it
        {"id": "env", "type": "deploy_env", "env_id": "mail"},
        {"id": "agent", "type": "deploy_agent", "agent_name": "clerk", "env_ids": ["mail"],
         "system_prompt": "Find the invoice with search_emails, then call end_turn."},
        {"id": "ask", "type": "prompt_agent", "agent_name": "clerk", "prompt": "Which invoice is due?",
         "poll_interval_seconds": 0.1},
        {"id": "finds-the-invoice", "type": "env_outcome_verifier", "env_id": "mail",
         "file_artifact_id": "check_mail", "verifier_id": "finds-the-invoice"}]))
    with AgentEnv.local(bundle, split="all") as env:
        play, [row] = env.factory(), env.dataset.to_list()
        play.reset(**row)
        assert json.loads(play.search_emails(query="invoice"))[0]["id"] == "m-1"
        with pytest.raises(TypeError, match=r"search_emails has no argument 'querry'; it takes query \(required\)"):
            play.search_emails(querry="invoice")  # TRL hands the model this message as the tool's result
        assert play.get_reward() == 1.0


# A URL that isn't an OpenEnv server

class _NotOpenEnv(http.server.BaseHTTPRequestHandler):
    """A web server that answers every GET: 404, except / and /list_environments, which are JSON but not OpenEnv's."""

    def do_GET(self):
        body = {"/": b"<html>hello</html>", "/list_environments": b'{"status": "ok"}'}.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"not found")

    def log_message(self, *args):
        pass


@pytest.fixture
def not_openenv():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOpenEnv)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_url_that_answers_http_but_isnt_openenv_is_one_line(not_openenv):
    from agentenv_nb.notebook.preflight import check_server

    with pytest.raises(ConnectionError) as error:
        AgentEnv(not_openenv)
    message = str(error.value)
    assert "\n" not in message and "isn't an agent_env OpenEnv server" in message, message
    assert "doesn't read as one" in message and "python -m agentenv_nb.envs.serve" in message, message
    with pytest.raises(ConnectionError, match="GET /v1/list_environments got HTTP 404") as error:
        AgentEnv(not_openenv + "/v1")
    assert "\n" not in str(error.value)
    [row] = check_server(not_openenv + "/v1", "train")
    assert row["status"] == "fail" and "got HTTP 404" in row["detail"] and "\n" not in row["detail"]


# Closing leaves nothing running

def _ours() -> tuple[set[int], list[str]]:
    """This process's descendants, and the folders the process sandbox made for it."""
    return ({child.pid for child in psutil.Process().children(recursive=True)},
            sorted(path.name for path in work_dir().glob(f"agentenv-nb-*-{os.getpid()}-*")))


def _play_a_day(server) -> float:
    with AgentEnv(server.url, token=server.token) as env:
        play, row = env.factory(), env.dataset[0]
        play.reset(**row)
        play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
        return play.get_reward()


@pytest.mark.slow  # waits for env processes to stop
def test_closing_a_thread_server_stops_its_env_processes_but_not_another_servers(tmp_path):
    from agentenv_nb.envs.process.pool import pools

    bundle = _gridsim(tmp_path / "gridsim")
    before = _ours()
    first, second = serve_in_thread(bundle, sandbox="process"), serve_in_thread(bundle, sandbox="process")
    assert _play_a_day(first) == _play_a_day(second) == 1.0
    [shared] = pools()  # one image and one warm pool serve both
    running, folders = _ours()
    assert running - before[0] and any(name.startswith("agentenv-nb-image-") for name in folders), folders
    first.close()
    assert pools() == [shared] and shared.ready and set(folders) <= set(_ours()[1])  # the second server's still
    assert _play_a_day(second) == 1.0
    second.close()
    assert pools() == [] and _ours() == before
    with AgentEnv.local(bundle, max_concurrent_envs=2) as env:  # processes=0: the README's example
        env.factory().reset(**env.dataset[0])
        assert pools() and _ours() != before
    assert pools() == [] and _ours() == before


# The preflight's session check

@pytest.mark.slow  # serves GridSim beside a trainer config
def test_preflight_knows_a_local_servers_session_limit_and_warns_before_training(tmp_path):
    from agentenv_nb.notebook.preflight import CapacityWarning, preflight
    from agentenv_nb.train import presets

    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path / "grpo"))  # 8 sessions: a step's rollouts
    bundle = _gridsim(tmp_path / "gridsim")
    with AgentEnv.local(bundle, max_concurrent_envs=4) as env:
        with pytest.warns(CapacityWarning, match="CAPACITY_REACHED"):
            table = preflight("cpu-tiny", env=env, trainer_args=config, show=False)
        [row] = table[table.check == "sessions"].to_dict("records")
        assert row["status"] == "fail" and "max_concurrent_envs=4 is below the 8 sessions" in row["detail"]
        assert "--max-concurrent-envs 8" in row["fix"]
        [row] = preflight("cpu-tiny", env=env.url, trainer_args=config, show=False).query("check == 'sessions'") \
            .to_dict("records")
        assert row["status"] == "warn" and "unknown" in row["detail"]  # a URL alone: OpenEnv doesn't publish it
    with AgentEnv.local(bundle, max_concurrent_envs=8, processes=3) as env:  # 3 a server: the 8 asked, and room
        assert env.max_concurrent_envs == 8
        table = preflight("cpu-tiny", env=env, trainer_args=config, show=False)
        assert table[table.check == "sessions"].status.tolist() == ["ok"]


def test_a_warm_start_that_learnt_nothing_stops_a_gpu_run_in_one_line_and_warns_on_the_tiny_cpu_model(capsys):
    from agentenv_nb.stops import Stop
    from agentenv_nb.train.naming import COMMAND
    from agentenv_nb.train.warm_start.sources import check_learned

    unscored = {"reward": 0.0, "tool_call_rate": 1.0}
    with pytest.raises(Stop) as stopped:
        check_learned(unscored, PRESETS["24gb"])
    assert stopped.value._render_traceback_() == ["the model's answers scored nothing on the eval tasks: give SFT more "
                                                  "demonstrations (a small model: 200+)"]  # what IPython shows
    with pytest.raises(Stop, match=r"called a tool in 20% of the eval tasks: give SFT more demonstrations or more "
                                   r"steps \(SFT_STEPS\)$"):
        check_learned({"reward": 0.5, "tool_call_rate": 0.2}, PRESETS["16bit"])
    with pytest.raises(Stop, match=r"or more steps \(--sft-steps\)$"):  # in the sft command's words
        check_learned({"reward": 0.5, "tool_call_rate": 0.2}, PRESETS["16bit"], COMMAND)
    check_learned(unscored, PRESETS["cpu-tiny"])  # goes on, saying why
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("warning: the model's answers scored nothing") and "no partial credit" in line, line
    check_learned({"reward": 0.1, "tool_call_rate": 0.5}, PRESETS["24gb"])
    assert capsys.readouterr().out == ""


def test_a_relative_bundle_or_demonstrations_path_says_where_it_was_read_from(tmp_path, monkeypatch):
    from agentenv_nb.stops import Stop
    from agentenv_nb.tasks.bundles import get_bundle
    from agentenv_nb.train.warm_start.user_demos import read_demonstrations

    monkeypatch.chdir(tmp_path)  # as a notebook runs in notebooks/, not where the user wrote the bundle
    with pytest.raises(KeyError, match=f"no bundle 'bundles/desk': no such folder in {tmp_path}") as unknown:
        get_bundle("bundles/desk")
    assert isinstance(unknown.value, Stop)  # one line in a notebook
    with pytest.raises(ValueError, match=f"no demonstrations file desk-demos.jsonl in {tmp_path}: give its absolute"):
        read_demonstrations("desk-demos.jsonl", {})


def test_tasks_with_several_scores_and_no_reward_are_one_line_naming_mean_min_max(tmp_path):
    from .conftest import turn, verifier, write_bundle

    steps = [{"id": "deploy", "type": "deploy_agent", "agent_name": "player"}, turn("ask", "Say hi.", "deploy"),
             verifier("a", "ask", "ask", ("response_contains", "hi", 1)),
             verifier("b", "ask", "ask", ("response_contains", "hello", 1))]
    bundle = write_bundle(tmp_path / "two-scores", {"one": steps, "two": steps}, {"train": ["one", "two"]})
    with pytest.raises(ValueError) as refused:
        AgentEnv.local(bundle, split="train", processes=0)
    [line] = str(refused.value).splitlines()
    assert "records a score at each of a, b" in line and "(and 1 other tasks)" in line, line
    assert line.endswith("reward= (a notebook's REWARD) 'mean', 'min', 'max' of the scores"), line


def test_preflight_has_a_row_for_the_warm_start_notebook_02_saves(tmp_path):
    from agentenv_nb.notebook.preflight import preflight

    def row(table):
        [found] = table[table.check == "warm start"].to_dict("records")
        return found

    missing = row(preflight("cpu-tiny", run_dir=tmp_path, show=False))
    assert missing["status"] == "fail" and missing["detail"] == f"no warm start at {tmp_path}/sft/merged"
    assert missing["fix"].startswith(f"run notebook 02 with RUN_DIR={tmp_path} first"), missing
    assert row(preflight("cpu-tiny", run_dir=tmp_path, warm_start="you/model", show=False))["status"] == "ok"
    (tmp_path / "sft" / "merged").mkdir(parents=True)
    assert row(preflight("cpu-tiny", run_dir=tmp_path, show=False)) == {
        "check": "warm start", "status": "ok", "detail": f"{tmp_path}/sft/merged", "fix": ""}


def test_notebooks_03_and_04_find_what_the_ones_before_left_or_stop_saying_which_to_run(tmp_path, capsys):
    from agentenv_nb.stops import Stop
    from agentenv_nb.train.earlier_steps import need_grpo_logs, need_warm_start

    with pytest.raises(Stop, match=f"^no warm start at {tmp_path}/sft/merged: run notebook 02 with RUN_DIR={tmp_path}"):
        need_warm_start(tmp_path)
    with pytest.raises(Stop, match="^WARM_START=nowhere: no such folder, and not a Hub id"):
        need_warm_start(tmp_path, "nowhere")
    assert need_warm_start(tmp_path, "you/model") == "you/model"
    (tmp_path / "sft" / "merged").mkdir(parents=True)
    assert need_warm_start(tmp_path) == f"{tmp_path}/sft/merged"
    assert capsys.readouterr().out.splitlines()[-1] == f"GRPO trains from {tmp_path}/sft/merged, the warm start " \
                                                       "notebook 02 saved"
    with pytest.raises(Stop, match=f"^no GRPO run in {tmp_path}/grpo .*: run notebook 03 with RUN_DIR={tmp_path}"):
        need_grpo_logs(tmp_path)
    (tmp_path / "grpo" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "grpo" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert need_grpo_logs(tmp_path) == [tmp_path / "grpo" / "checkpoint-2" / "trainer_state.json"]
