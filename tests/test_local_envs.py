"""The ``process`` sandbox end to end: a bundle copied from the framework's echo-mcp example, served by
``build_app(..., sandbox="process")`` on loopback, played over the OpenEnv WebSocket. No Docker, no mocks."""

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import agent_env
import psutil
import pytest
import uvicorn
import websockets

from .conftest import env_processes, free_port

from agentenv_nb.envs.process import pool as env_pool
from agentenv_nb.envs import tls
from agentenv_nb.envs.process import sandbox as process_sandbox
from agentenv_nb.envs.process import zygote

ECHO_ENV = Path(agent_env.__file__).parent / "examples" / "echo-mcp" / "envs" / "echo"
CAPACITY = 10
TEXTS = ["hello from a process", "another task's text"]  # one a task: each episode loads its own into /data
TEXT = TEXTS[0]

# The example's echo server, plus the task's text through the data plane and a grade extension for the verifier.
SERVER = '''
import json
from typing import Annotated
from pydantic import Field
from agentenv_protocol import AgentEnvEnvironment, add_data, environment_card, extension, reset_data, tool


@environment_card(name="echo")
class EchoEnv(AgentEnvEnvironment):
    def __init__(self):
        self.text, self.echoed = None, []

    @reset_data
    def clear(self):
        self.text, self.echoed = None, []

    @add_data
    def load(self, parts: list):
        for part in parts:
            with open(part.file.uri.removeprefix("file://"), encoding="utf-8") as handle:
                self.text = json.load(handle)["text"]

    @tool(name="echo")
    def echo(self, text: Annotated[str, Field(description="The text to send back.")]) -> str:
        """Return the text it's sent."""
        self.echoed.append(text)
        return text

    @extension("urn:test:grade/v1")
    def grade(self) -> dict:
        return {"text": self.text, "echoed": self.echoed}


if __name__ == "__main__":
    EchoEnv().serve()
'''
VERIFY = '''
import httpx


async def verify(mcp_url):
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(mcp_url.removesuffix("/mcp") + "/agentenv/ext/grade", json={})
    grade = response.json()
    return [{"id": "echoed", "result": grade["text"] is not None and grade["echoed"] == [grade["text"]],
             "description": str(grade)}]
'''
STEPS = [
    {"id": "env", "type": "deploy_env", "env_id": "echo"},
    {"id": "text", "type": "load_artifact", "env_id": "echo", "artifact_id": "text-{n}"},
    {"id": "agent", "type": "deploy_agent", "agent_name": "player", "env_ids": ["echo"]},
    {"id": "turn", "type": "prompt_agent", "agent_name": "player", "poll_interval_seconds": 0.1,
     "prompt": "Echo the text you were given, once."},
    {"id": "echoed", "type": "env_outcome_verifier", "env_id": "echo", "file_artifact_id": "check_echo",
     "verifier_id": "echoed"},
]


def write_bundle(root: Path, dockerfile_line: str = "", requirement: str = "") -> Path:
    """An echo bundle: the example's env (with ``dockerfile_line`` after its WORKDIR and ``requirement`` added),
    deployed as one server, and a task for each of TEXTS, loaded as an environment artifact (text.json)."""
    env = root / "envs" / "echo"
    shutil.copytree(ECHO_ENV, env, ignore=shutil.ignore_patterns("__pycache__"))
    (env / "env.toml").write_text('env_provider_type = "server"\n')
    (env / "server.py").write_text(SERVER)
    dockerfile = (env / "Dockerfile").read_text().replace("WORKDIR /app\n", f"WORKDIR /app\n{dockerfile_line}\n")
    (env / "Dockerfile").write_text(dockerfile)
    with (env / "requirements.txt").open("a") as requirements:
        requirements.write(f"{requirement}\n")
    (root / "tasks").mkdir()
    for n, text in enumerate(TEXTS):
        (root / "artifacts" / f"text-{n}").mkdir(parents=True)
        (root / "artifacts" / f"text-{n}" / "artifact.toml").write_text(
            'type = "environment"\nenvironment_name = "echo"\n')
        (root / "artifacts" / f"text-{n}" / "text.json").write_text(json.dumps({"text": text}))
        (root / "tasks" / f"say-{n}.json").write_text(json.dumps(STEPS).replace("{n}", str(n)))
    (root / "artifacts" / "check_echo").mkdir()
    (root / "artifacts" / "check_echo" / "verify.py").write_text(VERIFY)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of three splits, each the echo bundle: ``echo`` as it is, ``badfile`` with a RUN a process can't
    run, and ``missing`` with a requirement this Python lacks. Yields its WebSocket URL."""
    from agentenv_nb.envs.app import openenv_build_app

    build_app = openenv_build_app()  # as the kit's servers import it
    root = tmp_path_factory.mktemp("bundles")
    patch = pytest.MonkeyPatch()
    patch.setenv("AGENTENV_NB_WORK_DIR", str(root / "work"))
    patch.setenv("AGENTENV_NB_ENV_POOL", "2")
    tls.share_default_context()  # as the kit's servers do: agent_env makes an httpx client a request
    patch.setenv("XDG_STATE_HOME", str(root / "state"))  # a framework store of its own, not the machine's
    app = build_app({"echo": write_bundle(root / "echo"),
                     "badfile": write_bundle(root / "badfile", dockerfile_line="RUN apt-get update"),
                     "missing": write_bundle(root / "missing", requirement="agentenv-nb-no-such-package>=1")},
                    sandbox="process", max_concurrent_envs=CAPACITY)
    port = free_port()
    served = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    while not served.started:
        time.sleep(0.05)
    yield f"ws://127.0.0.1:{port}/ws"
    served.should_exit = True
    thread.join(30)
    env_pool.close_pools()
    patch.undo()


async def send(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await ws.recv())


async def reset(ws, split: str = "echo", index: int = 0) -> dict:
    return (await send(ws, {"type": "reset", "data": {"split": split, "index": index}}))["data"]


async def call(ws, tool: str, **arguments) -> dict:
    return (await send(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": tool,
                                                     "arguments": arguments}}))["data"]


async def play(url: str, text: str = TEXT, index: int = 0) -> dict:
    """An episode of task ``index`` that echoes ``text`` and ends its turn; the end_turn's observation."""
    async with websockets.connect(url, max_size=None) as ws:
        assert not (await reset(ws, index=index))["done"]
        await call(ws, "echo", text=text)
        return await call(ws, "end_turn", response="done")


def test_an_episode_runs_without_docker_and_scores_the_tool_call(server):
    async def run():
        async with websockets.connect(server, max_size=None) as ws:
            opened = await reset(ws)
            assert not opened["done"], opened
            tools = await send(ws, {"type": "step", "data": {"type": "list_tools"}})
            assert [t["name"] for t in tools["data"]["observation"]["tools"]] == ["echo", "end_turn"]
            echoed = await call(ws, "echo", text=TEXT)
            assert echoed["observation"]["result"]["data"] == TEXT
            return await call(ws, "end_turn", response="done")

    ended = asyncio.run(run())
    assert ended["done"] and ended["reward"] == 1.0, ended


async def play_both(url: str, texts: list[str]) -> list[float]:
    """The two tasks at once, echoing ``texts``: each process stages its task's file at its own /data/text.json."""
    ended = await asyncio.gather(*(play(url, text, index) for index, text in enumerate(texts)))
    return [observation["reward"] for observation in ended]


def test_concurrent_episodes_each_load_their_own_data(server):
    assert asyncio.run(play_both(server, TEXTS)) == [1.0, 1.0]
    assert asyncio.run(play_both(server, TEXTS[::-1])) == [0.0, 0.0]


def test_a_fresh_interpreter_per_episode_when_the_pool_is_off(server, monkeypatch):
    monkeypatch.setenv("AGENTENV_NB_ENV_POOL", "0")
    assert asyncio.run(play(server))["reward"] == 1.0


@pytest.mark.slow  # starts env processes until one gets a free port
def test_a_port_another_process_took_is_not_taken_for_the_env(server, monkeypatch):
    """An env's port is picked before the env binds it, so another process can take it first (under load, one reset
    in a few hundred did): the env must not be marked ready for that listener, which would have the episode talk to
    another env. Here the test holds the port, closing what connects; the sandbox starts the env on another port."""
    monkeypatch.setenv("AGENTENV_NB_ENV_POOL", "0")
    handed, free_port = [], env_pool.free_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()

        def refuse() -> None:  # what a listener that isn't the env looks like to the framework
            try:
                while True:
                    squatter.accept()[0].close()
            except OSError:  # the test closed it
                return

        def pick() -> int:  # the held port first, as if the race were lost; then free ones
            handed.append(free_port() if handed else squatter.getsockname()[1])
            return handed[-1]

        threading.Thread(target=refuse, daemon=True).start()
        monkeypatch.setattr(env_pool, "free_port", pick)
        assert asyncio.run(play(server))["reward"] == 1.0
    assert len(handed) == 2 and handed[0] != handed[1]  # the taken port, then a free one


def test_an_unknown_tool_and_bad_arguments_are_tool_errors_and_the_episode_goes_on(server):
    async def run():
        async with websockets.connect(server, max_size=None) as ws:
            await reset(ws)
            unknown = await call(ws, "shout", text=TEXT)
            missing = await call(ws, "echo")
            wrong = await call(ws, "echo", text={"not": "a string"})
            await call(ws, "echo", text=TEXT)
            return unknown, missing, wrong, await call(ws, "end_turn", response="done")

    unknown, missing, wrong, ended = asyncio.run(run())
    for failed in (unknown, missing, wrong):
        assert not failed["done"] and failed["observation"]["error"]["error_type"], failed
    assert "shout" in unknown["observation"]["error"]["message"]
    assert ended["reward"] == 1.0, ended


def test_a_session_past_max_concurrent_envs_is_refused(server):
    async def hold():
        """A session with an episode, once the earlier tests' closed sessions have left room for it."""
        for _ in range(100):
            ws = await websockets.connect(server, max_size=None)
            try:  # a refused session gets the error frame and is closed, maybe before the reset is sent
                if (await send(ws, {"type": "reset", "data": {"split": "echo", "index": 0}}))["type"] != "error":
                    return ws
            except websockets.ConnectionClosed:
                pass
            await ws.close()
            await asyncio.sleep(0.1)
        raise AssertionError("the server never made room")

    async def run():
        held = [await hold() for _ in range(CAPACITY)]
        try:
            async with websockets.connect(server, max_size=None) as extra:
                return json.loads(await extra.recv())  # sent as the session opens
        finally:
            await asyncio.gather(*(ws.close() for ws in held))

    refused = asyncio.run(run())
    assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED", refused


def test_a_dockerfile_line_a_process_cannot_run_is_named(server):
    async def run():
        async with websockets.connect(server, max_size=None) as ws:
            return await reset(ws, "badfile")

    refused = asyncio.run(run())
    assert refused["done"]
    assert "(Dockerfile) line 3: 'RUN apt-get update'" in refused["observation"]["metadata"]["error"], refused


def test_a_missing_requirement_is_named_with_how_to_install_it(server):
    async def run():
        async with websockets.connect(server, max_size=None) as ws:
            return await reset(ws, "missing")

    error = asyncio.run(run())["observation"]["metadata"]["error"]
    assert "agentenv-nb-no-such-package>=1 (requirements.txt line 4)" in error, error
    assert "-m pip install 'agentenv-nb-no-such-package>=1'" in error and "AGENTENV_NB_PIP_INSTALL=1" in error


@pytest.mark.slow  # waits for every env process of the module to settle
def test_no_process_or_folder_outlives_its_episode(server):
    """48 episodes, 8 at a time (each ending 12 times): played to the end, abandoned by a reset mid-episode, or dropped by closing the
    socket after the reset or after a tool call. Then only the warm pool is left, and nothing once it's closed."""
    async def episode(number: int) -> None:
        ending = number % 4
        async with websockets.connect(server, max_size=None) as ws:
            await reset(ws)
            if ending == 0:
                await call(ws, "echo", text=TEXT)
                assert (await call(ws, "end_turn", response="done"))["reward"] == 1.0
            elif ending == 1:
                await reset(ws)
            elif ending == 3:
                await call(ws, "echo", text=TEXT)

    async def run():
        for wave in range(0, 48, 8):
            await asyncio.gather(*(episode(n) for n in range(wave, wave + 8)))

    work = Path(os.environ["AGENTENV_NB_WORK_DIR"])
    for pool in env_pool.pools():  # other tests' servers in this process keep pools of their own
        if not Path(pool.image.app_dir).is_relative_to(work):
            pool.close()
    asyncio.run(run())

    def settled() -> tuple[int, int, int]:  # the pools refill in the background; slow under load, so re-read
        return len(env_folders(work)), sum(pool.ready for pool in env_pool.pools()), len(env_processes())

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (process_sandbox.running() or len(set(settled())) != 1):
        time.sleep(0.2)
    folders, ready, processes = settled()
    assert process_sandbox.running() == 0
    assert folders == ready == processes
    assert ready <= sum(max(pool.size, pool.peak) for pool in env_pool.pools())
    env_pool.close_pools()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (env_folders(work) or env_processes(forking=True)):
        time.sleep(0.1)
    assert env_folders(work) == [] and env_processes(forking=True) == []


def env_folders(work: Path) -> list[Path]:
    return list(work.glob("agentenv-nb-env-*"))


@pytest.mark.slow  # a thousand forks
def test_an_env_process_that_dies_as_its_parent_forks_is_seen_dead(tmp_path):
    """The forking parent reaps each child that dies and says how (the server tells the episode which env died): a
    death that comes as the parent goes back to reading its next order must not wait for that order, which may never
    come. The test kills each child the instant the parent answers, the moment a reaper run only by the signal's
    handler can miss."""
    (tmp_path / "app.py").write_text("import time\ntime.sleep(60)\n")
    exits = tmp_path / "exits"
    exits.mkdir()
    parent = subprocess.Popen([sys.executable, zygote.__file__, "fork", "[]", str(exits)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, cwd=tmp_path, start_new_session=True)
    os.set_blocking(parent.stdout.fileno(), False)
    unseen = []
    try:
        for round in range(1000):
            root = tmp_path / f"env-{round}"
            root.mkdir()
            order = {"app_dir": str(tmp_path), "script": str(tmp_path / "app.py"), "args": [], "env": {},
                     "port": 0, "root": str(root), "private": [], "secret": "s", "ids": None, "reads": []}
            parent.stdin.write(json.dumps(order).encode() + b"\n")
            parent.stdin.flush()
            answer = b""
            while not answer.endswith(b"\n"):  # spun, not waited on, to kill as the parent goes back to reading
                with contextlib.suppress(BlockingIOError):
                    answer += os.read(parent.stdout.fileno(), 100)
            pid = json.loads(answer)["pid"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 2
            while not (exits / str(pid)).exists() and time.monotonic() < deadline:
                time.sleep(0.001)
            if not (exits / str(pid)).exists():
                unseen.append(pid)
    finally:
        parent.stdin.close()
        parent.wait(10)
    assert not unseen, f"{len(unseen)} of 1000 deaths weren't reaped until the parent's next order"
