"""The env host on loopback: ``python -m agentenv_nb.envs.serve`` as its own process, ``AgentEnv(url)`` from this one,
the preflight against it, and one GRPO step of the tiny model whose rollouts play GridSim through it.

The server runs the envs with the ``process`` sandbox, as a notebook host without Docker or Modal would.
"""

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from .conftest import env_processes, free_port, listens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env_host(tmp_path_factory):
    """A GridSim bundle (4 train days, 2 eval) served by the serve command on a free loopback port; its URL."""
    from agentenv_nb.tasks import gridsim

    root = tmp_path_factory.mktemp("env-host")
    bundle = gridsim.write_bundle(root / "gridsim-tiny", train=4, eval=2)
    port = free_port()
    log = open(root / "serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "agentenv_nb.envs.serve", str(bundle), "--host", "127.0.0.1", "--port", str(port),
         "--sandbox", "process", "--max-concurrent-envs", "8"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group: its env processes go with it
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            try:
                if listens(server, port) and httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (root / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the serve command didn't answer /health within 180 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def test_preflight_sees_the_served_splits(env_host):
    from agentenv_nb.notebook.preflight import check_server

    [row] = check_server(env_host, "train")
    assert row["status"] == "ok" and "4 tasks" in row["detail"]
    [row] = check_server(env_host, "validation")
    assert row["status"] == "fail" and "all, eval, train" in row["detail"]


def test_a_grpo_step_through_agentenv_url(env_host, tmp_path):
    from agentenv_nb.stack import import_unsloth

    import_unsloth()
    from trl import GRPOTrainer
    from unsloth import FastLanguageModel

    from agentenv_nb.tasks import gridsim
    from agentenv_nb.train import presets
    from agentenv_nb.client import AgentEnv
    from agentenv_nb.notebook.preflight import capacity_warning, check_tools, preflight
    from agentenv_nb.train.model.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny", corpus_texts=[gridsim.generate.SYSTEM_PROMPT])
    model, tokenizer = FastLanguageModel.from_pretrained(**presets.model_kwargs("cpu-tiny", base))
    model = FastLanguageModel.get_peft_model(model, **presets.peft_kwargs("cpu-tiny"))
    # 64 tokens, not the preset's 512: the random model's text only costs time (8 rollouts on one thread)
    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path / "grpo"), max_steps=1, eval_strategy="no",
                                 eval_on_start=False, max_completion_length=64)
    with AgentEnv(env_host, split="train") as env:
        table = preflight("cpu-tiny", env=env, split="train", tokenizer=tokenizer, trainer_args=config,
                          max_concurrent_envs=8, show=False)
        # Import order depends on what else this pytest process ran first; a fresh process tests it.
        assert (table[table.check != "import order"].status == "ok").all(), table.to_string()
        bare = copy.copy(tokenizer)
        bare.chat_template = None
        [row] = check_tools(env, bare)
        assert row["status"] == "fail" and "no chat template" in row["detail"] and "use_tool_template" in row["fix"]
        assert capacity_warning(config, 8) is None  # 8 rollouts a step, 8 sessions served
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                              environment_factory=env.factory)
        trainer.train()
    [logged] = [log for log in trainer.state.log_history if "loss" in log]
    rewards = [value for key, value in logged.items() if key.startswith("rewards/") and key.endswith("/mean")]
    assert rewards and all(math.isfinite(value) for value in rewards), logged  # scored by the server's verifier
    assert "tools/call_frequency" in logged


def test_local_server_processes_share_the_sessions_and_leave_nothing_behind(tmp_path):
    from agentenv_nb.tasks import gridsim
    from agentenv_nb.client import AgentEnv
    from agentenv_nb.envs.workdir import work_dir
    from agentenv_nb.client.environment import player_of
    from agentenv_nb.client.session import CapacityError, ws_url

    bundle = gridsim.write_bundle(tmp_path / "gridsim-tiny", train=4, eval=2)
    with AgentEnv.local(bundle, sandbox="process", max_concurrent_envs=4, processes=2) as env:
        servers = env.server.processes
        rows, plays = env.dataset.to_list(), [env.factory() for _ in range(4)]
        assert sorted(player_of(play).session.url for play in plays) == sorted(2 * [ws_url(url) for url in env.urls])
        for play, row in zip(plays, rows):
            play.reset(**row)
        for play in plays:
            day = gridsim.battery.optimal_schedule(json.loads(play.get_prices()))
            play.submit_schedule(schedule=day)
        assert [play.get_reward() for play in plays] == [1.0] * 4
        for play in plays:  # sessions end unevenly: the second server's both, the first server's none
            if player_of(play).session.url == ws_url(env.urls[1]):
                player_of(play).close()
        later = [env.factory() for _ in range(2)]
        for play, row in zip(later, rows):  # the first in turn is full: each goes on to the server with room
            play.reset(**row)
        assert [player_of(play).session.url for play in later] == 2 * [ws_url(env.urls[1])]
        for play in later:
            play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
        assert [play.get_reward() for play in later] == [1.0] * 2
        with pytest.raises(CapacityError, match="max_concurrent_envs"):  # each server holds 4 / 2 sessions
            env.factory().reset(**rows[0])
        # Each server keeps as many env processes ready as it holds sessions, not AGENTENV_NB_ENV_POOL's 8: its 2 in
        # use and 2 ready at most.
        running = [len(env_processes(psutil.Process(server.pid))) for server in servers]
        assert max(running) <= 4, running
    assert [server.returncode for server in servers] == [0, 0]  # shut down, not killed
    left = [path.name for server in servers for path in work_dir().glob(f"agentenv-nb-*-{server.pid}-*")]
    assert not left, left


def test_the_default_server_processes_fit_the_cores_this_process_may_use():
    """One server a core, up to 8: on 2 cores, 8 servers each preparing 1,800 GridSim tasks started in 103 s or past
    the start timeout, 2 in 28 s. The notebooks and the training command take the same default."""
    def default_on(cores: set[int]) -> int:
        probe = "from agentenv_nb.train.grpo.run import GRPORun; print(GRPORun().server_processes)"
        return int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                  preexec_fn=lambda: os.sched_setaffinity(0, cores)).stdout)

    assert default_on({0}) == 1 and default_on({0, 1}) == 2
    cells = json.loads((Path(__file__).parents[1] / "notebooks/02_sft_warm_start.ipynb").read_text())["cells"]
    [parameters] = [cell for cell in cells if "parameters" in cell["metadata"].get("tags", [])]
    assert "SERVER_PROCESSES = servers_for_host()" in "".join(parameters["source"])


def test_server_processes_say_why_they_cannot_start(tmp_path):
    from agentenv_nb.envs.serve.processes import serve_in_processes
    from agentenv_nb.envs.workdir import work_dir
    from agentenv_nb.tasks import gridsim

    with pytest.raises(ValueError, match="step id"):
        serve_in_processes(tmp_path, 1, reward=lambda scores: 1.0)
    with pytest.raises(KeyError, match="no bundle .*no-bundle': no such folder"):  # said here, before any starts
        serve_in_processes(tmp_path / "no-bundle", 1)
    bundle = gridsim.write_bundle(tmp_path / "gridsim-tiny", train=1, eval=1)
    with pytest.raises(RuntimeError, match="exited while starting:\n.*AGENTENV_NB_PORT='abc' isn't a whole number"):
        serve_in_processes(bundle, 1, sandbox="process", env={**os.environ, "AGENTENV_NB_PORT": "abc"})
    # Servers slower than the start timeout: the error says what to do and quotes what they wrote (here Python's
    # list of imports), as their folder goes with them
    with pytest.raises(TimeoutError, match=r"[12] of 2 server processes didn't answer .* start fewer \(processes=\)"
                                           r"(.|\n)*server process [01] wrote:\n(.|\n)*import") as refused:
        serve_in_processes(bundle, 2, sandbox="process", start_timeout=0.2, env={**os.environ, "PYTHONVERBOSE": "1"})
    assert not list(work_dir().glob(f"agentenv-nb-servers-{os.getpid()}-*")), str(refused.value)[:300]
