"""An env host that lets no one in who shouldn't be, tried as an attacker and a careless user would: the serve
command and servers of AgentEnv.local on loopback, real env processes, real episodes.

- a client without the token, with a wrong one, or from a web page (a foreign Origin), and the HTTP routes that
  would make envs past the session limit, are refused; an idle session is closed and frees its slot;
- a local process calling another episode's env process is refused (the episode's secret), env processes run as
  users of their own without the server's secrets; the work dir is private;
- bad settings, an env that can't start and an env that dies are said at once, naming what; SIGINT and SIGTERM stop
  the serve command quietly, leaving nothing behind.
"""

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentenv_nb import settings
from agentenv_nb.client import AgentEnv
from agentenv_nb.client.environment import player_of
from agentenv_nb.client.session import Session, SessionError
from agentenv_nb.envs.choice import SandboxError
from agentenv_nb.envs.process.dockerfile import ImageError
from agentenv_nb.envs.serve.thread import serve_in_thread
from agentenv_nb.envs.workdir import WorkDirError
from agentenv_nb.tasks import gridsim

from .conftest import free_port, listens

SERVE = [sys.executable, "-m", "agentenv_nb.envs.serve"]
SECRETS = {"HF_TOKEN": "hf_not_for_envs", "MODAL_TOKEN_SECRET": "modal_not_for_envs"}


@pytest.fixture(autouse=True)
def own_work_dir(tmp_path, monkeypatch):
    """A work dir and a store of this test's own, the process sandbox, a small pool, and secrets an env mustn't see."""
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AGENTENV_NB_ENV_POOL", "2")
    monkeypatch.setenv("AGENTENV_NB_SANDBOX", "process")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def _bundle(root: Path, train: int = 2) -> Path:
    return gridsim.write_bundle(root, train=train, eval=1)


def _play_optimum(play) -> float | None:
    play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
    return play.get_reward()


async def _handshake(url: str, headers: dict | None) -> str:
    """What a raw WebSocket client gets at ``/ws``: ``open``, or the HTTP status refusing it."""
    try:
        async with connect(url.replace("http://", "ws://") + "/ws", additional_headers=headers, proxy=None):
            return "open"
    except InvalidStatus as e:
        return str(e.response.status_code)


class _ServeCommand:
    """``python -m agentenv_nb.envs.serve`` as a user starts it; its first line of output, its URL."""

    def __init__(self, bundle: Path, tmp_path: Path, *args: str, env: dict | None = None):
        self.port = free_port()
        self.log = tmp_path / f"serve-{self.port}.log"
        self.process = subprocess.Popen([*SERVE, str(bundle), "--port", str(self.port), *args],
                                        stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True,
                                        env={**os.environ, **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, token: str | None = None, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Bearer {token}"} if token else None
        while True:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if listens(self.process, self.port) and httpx.get(
                        f"{self.url}/health", headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.3)

    def stop(self, how: signal.Signals) -> tuple[int, str]:
        self.process.send_signal(how)
        code = self.process.wait(60)
        return code, self.log.read_text()


# Finding 1: anyone who reaches the port plays

@pytest.mark.slow
def test_the_serve_command_listens_on_loopback_and_beyond_it_needs_the_token_it_prints_once(tmp_path):
    bundle = _bundle(tmp_path / "gridsim")
    local = _ServeCommand(bundle, tmp_path)
    local.wait()
    listening = {c.laddr.ip for c in psutil.Process(local.process.pid).net_connections("tcp") if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}
    code, log = local.stop(signal.SIGINT)
    assert code == 0 and "Traceback" not in log, log

    wide = _ServeCommand(bundle, tmp_path, "--host", "0.0.0.0")
    said = next(line for line in wide.process.stdout if "access token" in line)  # after the sandbox's choice
    token = said.split("access token ")[1].split()[0]
    wide.wait(token)
    assert httpx.get(f"{wide.url}/health").status_code == 401
    assert httpx.get(f"{wide.url}/list_environments", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with pytest.raises(PermissionError, match="needs its access token, which this AgentEnv lacks"):
        AgentEnv(wide.url)
    with AgentEnv(wide.url, token=token) as env:
        play = env.factory()
        play.reset(**env.dataset[0])
        assert _play_optimum(play) == 1.0
    code, log = wide.stop(signal.SIGTERM)
    assert code == 0 and "Traceback" not in log and token not in log, log
    assert token not in wide.process.stdout.read()  # printed once: uvicorn's access log doesn't show it
    assert sorted(os.listdir(tmp_path / "work")) == []  # images, env folders, server logs and the store all gone


def test_no_token_no_wrong_token_no_foreign_origin_and_no_episodes_over_http(tmp_path):
    with AgentEnv.local(_bundle(tmp_path / "gridsim"), max_concurrent_envs=2) as env:
        auth = {"Authorization": f"Bearer {env.token}"}
        assert env.token and len(env.token) >= 32
        assert httpx.get(f"{env.url}/health").status_code == 401
        assert httpx.get(f"{env.url}/docs").status_code == 401  # nor the task API and its eval prompts
        for path in ("/reset", "/step", "/mcp"):  # each would make an env past max_concurrent_envs
            refused = httpx.post(f"{env.url}{path}", json={}, headers=auth)
            assert refused.status_code == 404 and "/ws" in refused.json()["detail"], path
        opened = asyncio.run(_handshake(env.url, {"Authorization": "Bearer wrong"}))
        foreign = asyncio.run(_handshake(env.url, {**auth, "Origin": "http://evil.example"}))
        mine = asyncio.run(_handshake(env.url, auth))
        assert (opened, foreign, mine) == ("403", "403", "open")
        with pytest.raises(Exception, match="refused the session .*access token"):
            asyncio.run(Session(env.url, patience=1).open())


def test_an_idle_session_is_closed_and_frees_its_slot(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENV_NB_IDLE_TIMEOUT", "1")
    with serve_in_thread(_bundle(tmp_path / "gridsim"), max_concurrent_envs=1) as server:
        async def run():
            idle = Session(server.url, token=server.token, patience=0.5)
            await idle.open()
            await asyncio.sleep(2.5)  # past the idle timeout
            second = Session(server.url, token=server.token, patience=0.5)
            await second.open()  # the idle one's slot is free again
            await second.close()
            with pytest.raises(Exception, match="closed"):
                await idle.step({"type": "list_tools"})

        asyncio.run(run())



def _raw(port: int, request: str) -> str:
    """The status line a server answers a raw HTTP request with, as a browser's socket would send it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(request.encode())
        return raw.recv(4096).decode("latin-1").split("\r\n")[0]


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_a_dns_rebinding_page_cannot_reach_a_loopback_server_without_a_token(tmp_path):
    """A page on evil.example, whose DNS answer became 127.0.0.1, sends its own name as Host and Origin: its
    WebSocket upgrade and its read of the eval prompts are refused; the server's own names are served."""
    server = _ServeCommand(_bundle(tmp_path / "gridsim"), tmp_path)
    server.wait()

    def upgrade(host: str) -> str:
        return _raw(server.port, f"GET /ws HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\n"
                                 "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")

    def prompts(host: str) -> str:
        return _raw(server.port, f"GET /gridsim/splits HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")

    attacker = f"evil.example:{server.port}"
    assert upgrade(attacker).startswith("HTTP/1.1 403") and prompts(attacker).startswith("HTTP/1.1 403")
    for own in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        assert upgrade(own).startswith("HTTP/1.1 101") and prompts(own).startswith("HTTP/1.1 200"), own
    code, log = server.stop(signal.SIGINT)
    assert code == 0 and "Traceback" not in log, log


def _env_processes() -> int:
    """How many env processes of this process's servers listen: those in episodes and those kept warm."""
    listening = 0
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # one that ended as it was listed
            listening += any(c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp"))
    return listening


def test_the_warm_env_processes_of_a_burst_go_once_the_pool_is_idle(tmp_path, monkeypatch):
    """A burst of 4 resets leaves 4 processes warm for the next burst (AGENTENV_NB_ENV_POOL is 2 here); none taken
    for AGENTENV_NB_IDLE_TIMEOUT seconds, the pool is back to 2, not holding the burst's till the server stops."""
    monkeypatch.setenv("AGENTENV_NB_IDLE_TIMEOUT", "2")
    with AgentEnv.local(_bundle(tmp_path / "gridsim", train=4), max_concurrent_envs=4) as env:
        plays = [env.factory() for _ in range(4)]
        for play, row in zip(plays, env.dataset.to_list(), strict=True):
            play.reset(**row)
            play.get_prices()
        for play in plays:
            player_of(play).close()
        deadline = time.monotonic() + 60
        while _env_processes() != 2:  # the episodes' ended; the pool refilled to the burst's 4, then shrank
            assert time.monotonic() < deadline, _env_processes()
            time.sleep(0.2)
        time.sleep(3)  # a refill still under way would show now
        assert _env_processes() == 2


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_the_serve_command_stopped_with_a_reset_in_flight_logs_no_traceback(tmp_path):
    server = _ServeCommand(_bundle(tmp_path / "gridsim"), tmp_path)
    server.wait()

    async def reset_then_stop() -> None:
        async with connect(server.url.replace("http://", "ws://") + "/ws", proxy=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"split": "all", "index": 0}}))
            await asyncio.sleep(0.3)  # the reset deploys its env
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed):
                await ws.recv()

    asyncio.run(reset_then_stop())
    code, log = server.stop(signal.SIGTERM)
    assert code == 0 and "Traceback" not in log and "Exception in ASGI application" not in log, log


# Findings 2 and 3: another local user, another episode

def test_a_work_dir_another_user_owns_or_may_write_is_refused(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path / "gridsim")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(planted))
    with pytest.raises(WorkDirError, match="may be written by others"):
        AgentEnv.local(bundle)
    if os.geteuid() == 0:
        os.chown(planted, 65534, 65534)  # made first by `nobody`, as under a world-writable /var/tmp
        planted.chmod(0o755)
        with pytest.raises(WorkDirError, match="belongs to user id 65534"):
            AgentEnv.local(bundle)
    fresh = tmp_path / "fresh" / "work"
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(fresh))
    with AgentEnv.local(bundle, max_concurrent_envs=1):
        mode = stat.S_IMODE(fresh.stat().st_mode)
        assert mode in (0o700, 0o710) and fresh.stat().st_uid == os.geteuid()  # 0710: env users enter, never list


def test_a_work_dir_under_a_folder_another_user_owns_or_may_write_is_refused(tmp_path, monkeypatch):
    """Whoever may write a folder above the work dir can move the work dir away and put another in its place."""
    bundle = _bundle(tmp_path / "gridsim")
    shared = tmp_path / "shared"
    (shared / "deeper" / "work").mkdir(parents=True, mode=0o700)
    shared.chmod(0o775)  # group-writable, not sticky, two levels up
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(shared / "deeper" / "work"))
    with pytest.raises(WorkDirError, match=f"{shared}, above the work dir, may be written by others"):
        AgentEnv.local(bundle)
    shared.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)  # another user's folder, as a home whose owner lent a subfolder
        with pytest.raises(WorkDirError, match=f"{shared}, above the work dir, belongs to user id 65534"):
            AgentEnv.local(bundle)
        os.chown(shared, 0, 0)
    linked = tmp_path / "linked"
    linked.symlink_to(shared)  # the same folders reached through a link: followed, and checked
    shared.chmod(0o777)
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(linked / "deeper" / "work"))
    with pytest.raises(WorkDirError, match="above the work dir, may be written by others"):
        AgentEnv.local(bundle)


_STOPPED_MID_EPISODE = """import sys, time
from agentenv_nb.client import AgentEnv

env = AgentEnv.local(sys.argv[1], max_concurrent_envs=1)
play = env.factory()
play.reset(**env.dataset[0])
play.get_prices()
print("playing", flush=True)
time.sleep(300)
"""


def test_sigterm_to_a_script_using_agentenv_local_leaves_nothing_behind(tmp_path):
    script = subprocess.Popen([sys.executable, "-c", _STOPPED_MID_EPISODE, str(_bundle(tmp_path / "gridsim"))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "playing\n" in iter(script.stdout.readline, ""), script.stderr.read()[-3000:]
    started = psutil.Process(script.pid).children(recursive=True)
    script.send_signal(signal.SIGTERM)
    assert script.wait(60) == 128 + signal.SIGTERM
    assert "Traceback" not in script.stderr.read()
    assert sorted(os.listdir(tmp_path / "work")) == []  # env folders, images, the store: all gone with it
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_local_process_cannot_call_another_episodes_env_and_envs_hold_no_secrets(tmp_path):
    with AgentEnv.local(_bundle(tmp_path / "gridsim"), max_concurrent_envs=2) as env:
        victim, other = env.factory(), env.factory()
        victim.reset(**env.dataset[0])
        other.reset(**env.dataset[1])
        victim.get_prices(), other.get_prices()
        serving = [p for p in psutil.Process().children(recursive=True)
                   if any(c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp"))]
        assert serving, "no env process listens"
        for process in serving:
            if os.geteuid() == 0:
                assert process.uids().real >= 2_000_000_000  # a user of its own, not root
            assert not set(SECRETS) & set(process.environ()), process.environ()
            assert settings.SETTINGS["token"].variable not in process.environ()
            for port in (c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN):
                for call in (lambda: httpx.get(f"http://127.0.0.1:{port}/.well-known/agent-env.json"),
                             lambda: httpx.post(f"http://127.0.0.1:{port}/mcp", json={}),
                             lambda: httpx.get(f"http://agentenv:guess@127.0.0.1:{port}/.well-known/agent-env.json")):
                    assert call().status_code == 401
        if os.geteuid() == 0:
            users = {p.uids().real for p in serving}
            assert len(users) == len(serving)  # each its own: none can signal or read another
        for play in (victim, other):  # the episodes themselves go on (a reward ends every open episode of the thread)
            play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
        assert [victim.get_reward(), other.get_reward()] == [1.0, 1.0]


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own needs root, as on Colab")
def test_each_env_process_has_a_tmp_of_its_own_wherever_the_kit_lives(tmp_path):
    """The work dir is under /tmp here (pytest's tmp_path), as a kit or its virtual environment under /tmp would be:
    each episode's env still gets a /tmp of its own, and still reads its app from the work dir."""
    host_file = Path(tempfile.mkdtemp(prefix="agentenv-nb-test-", dir="/tmp")) / "host.txt"
    host_file.write_text("the host's")
    try:
        with AgentEnv.local(_bundle(tmp_path / "gridsim"), max_concurrent_envs=2) as env:
            plays = [env.factory(), env.factory()]
            prices = []
            for index, play in enumerate(plays):
                play.reset(**env.dataset[index])
                prices.append(json.loads(play.get_prices()))
            serving = [p for p in psutil.Process().children(recursive=True)
                       if any(c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp"))]
            assert len(serving) >= 2
            for process in serving:  # /proc/PID/root: the filesystem as that process sees it
                own_tmp = Path(f"/proc/{process.pid}/root/tmp")
                assert not (own_tmp / host_file.relative_to("/tmp")).exists()
                (own_tmp / f"written-by-{process.pid}").write_text("mine")
            for process in serving:
                assert [p.name for p in Path(f"/proc/{process.pid}/root/tmp").glob("written-by-*")] == [
                    f"written-by-{process.pid}"]
            assert not list(Path("/tmp").glob("written-by-*"))
            for play, day in zip(plays, prices, strict=True):  # a reward ends every open episode of the thread
                play.submit_schedule(schedule=gridsim.battery.optimal_schedule(day))
            assert [play.get_reward() for play in plays] == [1.0, 1.0]
    finally:
        shutil.rmtree(host_file.parent, ignore_errors=True)


def test_the_guard_on_env_ports_still_hooks_uvicorn():
    """The env processes' secret relies on uvicorn's Config.load setting Config.loaded_app: fail loudly if not."""
    import uvicorn.config

    async def app(scope, receive, send):
        pass

    config = uvicorn.config.Config(app)
    config.load()
    assert config.loaded_app is not None and hasattr(uvicorn.config.Config, "load")



def test_a_dockerfile_or_requirements_file_reads_nothing_outside_its_build_context(tmp_path):
    """A credentials file 0644 in a 0700 folder, as `modal token new` leaves ~/.modal.toml: the sandbox copies and
    reads as the server's user, root too, so a COPY or a nested ``-r`` naming it, by ``..``, by a link or by its
    absolute path, is refused, and no refusal quotes it."""
    secret = tmp_path / "home" / ".modal.toml"
    secret.parent.mkdir(mode=0o700)
    secret.write_text("token_secret = 'as-not-for-envs'\n")
    secret.chmod(0o644)
    for case, (line, requirements) in enumerate([
            ("COPY ../../../home/.modal.toml ./x", None),
            ("COPY link ./x", None),
            ("RUN pip install -r requirements.txt", f"-r {secret}\n"),
            ("RUN pip install -r requirements.txt", "-r ../../../../../../../../../../../../" + str(secret) + "\n")]):
        bundle = _bundle(tmp_path / f"case{case}")
        env = bundle / "envs" / "gridsim"
        if "link" in line:
            (env / "link").symlink_to(secret)
        if requirements:
            (env / "requirements.txt").write_text(requirements)
        dockerfile = (env / "Dockerfile").read_text().replace("COPY battery.py", f"{line}\nCOPY battery.py")
        (env / "Dockerfile").write_text(dockerfile)
        with pytest.raises(SandboxError, match="is outside (the build context|the image's WORKDIR)") as refused:
            AgentEnv.local(bundle, max_concurrent_envs=1)
        assert "as-not-for-envs" not in str(refused.value), line
    assert not (tmp_path / "work").exists()  # refused before any env process started


_ONE_RUN = """import json, os, sqlite3, sys
from pathlib import Path
from agentenv_nb.client import AgentEnv
from agentenv_nb.tasks import gridsim

with AgentEnv.local(sys.argv[1], max_concurrent_envs=1) as env:
    for row in env.dataset.to_list():
        with env.factory() as play:
            play.reset(**row)
            play.submit_schedule(schedule=gridsim.battery.optimal_schedule(json.loads(play.get_prices())))
            assert play.get_reward() == 1.0
    store = Path(os.environ["XDG_STATE_HOME"])
    indexed = {db.name: [sql for (sql,) in sqlite3.connect(db).execute(
        "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name='docs_agent_env_a2a_conversations'")]
        for db in store.glob("agent-env/document_store/*.db")}
print(json.dumps({"store": str(store), "indexed": indexed}))
"""


def test_agentenv_local_keeps_its_store_with_the_run_indexed_and_removes_it(tmp_path):
    """agent_env's default store, ~/.local/state/agent-env, outlived every run and grew with it; where a bundle's
    episodes keep their conversations (its @local file), a lookup parsed every conversation without an index."""
    home = tmp_path / "home"
    environ = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"} | {"HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", _ONE_RUN, str(_bundle(tmp_path / "gridsim"))], capture_output=True,
                          text=True, timeout=300, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(said["store"]).parent == tmp_path / "work"  # a folder of the run's own
    assert any("conversation_id" in sql for sql in said["indexed"]["local.db"]), said
    assert not (home / ".local").exists() and not Path(said["store"]).exists()


# Findings 5 and 6: settings, faults

def test_agentenv_local_honours_the_session_setting_and_refuses_bad_ones_before_serving(tmp_path, monkeypatch):
    bundle = _bundle(tmp_path / "gridsim")
    monkeypatch.setenv("AGENTENV_NB_MAX_CONCURRENT_ENVS", "3")
    with AgentEnv.local(bundle) as env:
        assert env.max_concurrent_envs == 3
    untouched = tmp_path / "untouched"  # made by the first env process a start would run
    monkeypatch.setenv("AGENTENV_NB_WORK_DIR", str(untouched))
    for name, value, says in [("MAX_CONCURRENT_ENVS", "abc", "isn't a whole number"),
                              ("MAX_CONCURRENT_ENVS", "-5", "out of range"),
                              ("PATIENCE", "nan", "isn't a finite number"),
                              ("CALL_TIMEOUT", "nan", "isn't a finite number"),
                              ("ENV_POOL", "100000", "from 0 to 64"),
                              ("WORK_DIR", str(bundle / "envs" / "gridsim" / "Dockerfile"), "is a file"),
                              ("IDLE_TIMEOUT", "inf", "isn't a finite number")]:
        monkeypatch.setenv(f"AGENTENV_NB_{name}", value)
        with pytest.raises(settings.SettingError, match=f"AGENTENV_NB_{name}=.*{says}"):
            AgentEnv.local(bundle)
        monkeypatch.delenv(f"AGENTENV_NB_{name}")
    assert not untouched.exists()  # refused before any env process or server started


def test_every_numeric_setting_past_its_working_range_is_refused_naming_it(tmp_path, monkeypatch):
    """1e10 seconds is finite, and overflowed a clock deep in asyncio or a thread's join, far from the variable."""
    bundle = _bundle(tmp_path / "gridsim")
    numeric = [s for s in settings.SETTINGS.values() if s.kind in (int, float)]
    assert {"reset_timeout", "call_timeout", "patience", "env_start_timeout", "idle_timeout"} <= {s.name for s in numeric}
    for setting in numeric:
        monkeypatch.setenv(setting.variable, "1e10" if setting.kind is float else str(10**10))
        with pytest.raises(settings.SettingError, match=f"^{setting.variable}=.* is out of range: .* from .* to "):
            AgentEnv.local(bundle)
        monkeypatch.delenv(setting.variable)
    assert not (tmp_path / "work").exists()  # refused before any env process or server started


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_the_serve_command_refuses_a_huge_timeout_in_one_line(tmp_path):
    for name in ("ENV_START_TIMEOUT", "CALL_TIMEOUT", "RESET_TIMEOUT", "PATIENCE"):
        failed = subprocess.run([*SERVE, str(_bundle(tmp_path / name))], capture_output=True, text=True, timeout=120,
                                env={**os.environ, f"AGENTENV_NB_{name}": "1e10"})
        assert failed.returncode == 2 and f"AGENTENV_NB_{name}='1e10' is out of range" in failed.stderr, failed.stderr
        assert failed.stderr.strip().count("\n") == 0
    assert not (tmp_path / "work").exists()


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_a_guessable_token_is_refused_without_showing_it(tmp_path):
    failed = subprocess.run([*SERVE, str(_bundle(tmp_path / "gridsim")), "--host", "0.0.0.0"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "AGENTENV_NB_TOKEN": "k3y"})
    assert failed.returncode == 2 and "AGENTENV_NB_TOKEN is shorter than 16 characters" in failed.stderr
    assert "k3y" not in failed.stderr and failed.stderr.strip().count("\n") == 0, failed.stderr


def _broken(root: Path) -> Path:
    """A GridSim bundle whose env raises as it is imported."""
    bundle = _bundle(root)
    server = bundle / "envs" / "gridsim" / "server.py"
    server.write_text("raise RuntimeError('a broken import')\n" + server.read_text())
    return bundle


def test_an_env_that_cannot_start_fails_the_start_naming_it(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)env 'gridsim' .* can't start as a local process.*a broken import"):
        AgentEnv.local(_broken(tmp_path / "gridsim"))


def test_an_env_is_tried_once_a_process_until_it_changes(tmp_path):
    """Resolving a bundle starts each env once (the trial) in a process, and again only when one of its files changed,
    wherever the bundle lies. The env here raises as it is imported once a flag file exists: set after the first trial,
    the flag fails only a trial that runs again."""
    import shutil
    import tempfile

    from agentenv_nb.envs.resolve import resolve

    flag = Path(tempfile.mkdtemp(prefix="agentenv-nb-test-", dir="/var/tmp")) / "fail"  # outside an env's own /tmp
    flag.parent.chmod(0o755)  # for the user an env process runs as
    try:
        bundle = _bundle(tmp_path / "gridsim")
        server = bundle / "envs" / "gridsim" / "server.py"
        server.write_text(f"import os\nif os.path.exists({str(flag)!r}): raise RuntimeError('tried again')\n"
                          + server.read_text())
        resolve(bundle, "process")
        flag.touch()
        resolve(bundle, "process")  # the same env: not started again
        resolve(shutil.copytree(bundle, tmp_path / "copy"), "process")  # the same files elsewhere
        server.write_text(server.read_text() + "# changed\n")
        with pytest.raises(RuntimeError, match="(?s)can't start as a local process.*tried again"):
            resolve(bundle, "process")
    finally:
        shutil.rmtree(flag.parent, ignore_errors=True)


@pytest.mark.slow  # the serve command in a fresh interpreter
def test_the_serve_command_says_an_env_cannot_start_in_one_line(tmp_path):
    failed = subprocess.run([*SERVE, str(_broken(tmp_path / "gridsim"))], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "a broken import" in failed.stderr and "Traceback" not in failed.stderr.split(
        "error:")[0], failed.stderr
    assert failed.stderr.strip().count("\n") == 0


def test_a_dead_env_process_says_which_env_died_and_how(tmp_path):
    with AgentEnv.local(_bundle(tmp_path / "gridsim"), max_concurrent_envs=1) as env:
        play = env.factory()
        play.reset(**env.dataset[0])
        play.get_prices()
        for process in psutil.Process().children(recursive=True):  # the episode's among the pool's ready ones
            if any(c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp")):
                os.killpg(process.pid, signal.SIGKILL)
        # at once, before the sandbox's next check: the call's ReadError or ConnectError waits for its report
        with pytest.raises(Exception, match=r"(Read|Connect)Error.* \(the env process of 'gridsim' \(pid \d+\) died "
                                            "mid-episode: killed by SIGKILL"):
            play.submit_schedule(schedule=[0] * 24)



# An env served by uvicorn, as the process sandbox requires, that SIGKILLs itself when asked for its card: it dies as
# the reset deploys it, after its process started and listened, as a process a kill hits at that moment does.
_DIES_AS_IT_DEPLOYS = """import os, signal
import uvicorn

async def app(scope, receive, send):
    if scope["type"] == "http":
        os.kill(os.getpid(), signal.SIGKILL)

uvicorn.run(app, host="127.0.0.1", port=int(os.environ["MCP_PORT"]), lifespan="off")
"""


def _dying_bundle(root: Path) -> Path:
    env = root / "envs" / "dies"
    env.mkdir(parents=True)
    (env / "env.toml").write_text('env_provider_type = "server"\nenvironment_name = "dies"\n')
    (env / "server.py").write_text(_DIES_AS_IT_DEPLOYS)
    (env / "Dockerfile").write_text('FROM python:3.11-slim\nWORKDIR /app\nCOPY server.py ./\nCMD ["python", "server.py"]\n')
    (root / "tasks").mkdir()
    (root / "tasks" / "deploy.json").write_text(json.dumps([
        {"id": "env", "type": "deploy_env", "env_id": "dies"},
        {"id": "agent", "type": "deploy_agent", "agent_name": "player", "env_ids": ["dies"], "depends_on": ["env"],
         "system_prompt": "Call end_turn."},
        {"id": "ask", "type": "prompt_agent", "agent_name": "player", "prompt": "Go.", "depends_on": ["agent"],
         "poll_interval_seconds": 0.1}]))
    return root


def test_a_reset_whose_env_dies_as_it_deploys_fails_at_once_saying_which_env_died(tmp_path):
    """agent_env's deploy would wait out its card timeout (180 s) for the dead process, past the client's
    reset_timeout; the reset ends as the sandbox sees the death, and its session's slot is free for the next one."""
    with serve_in_thread(_dying_bundle(tmp_path / "dies"), max_concurrent_envs=1) as server:
        async def two_resets() -> list[str]:
            session, said = Session(server.url, token=server.token, reset_timeout=60, patience=2), []
            await session.open()
            for _ in range(2):  # the first reset's connection closed with it: the second opens another
                with pytest.raises(SessionError) as failed:
                    await session.reset("all", 0)
                said.append(str(failed.value))
            await session.close()
            return said

        said = asyncio.run(two_resets())
    assert all(re.search(r"answered reset with EXECUTION_ERROR: the reset failed: the env process of 'dies' "
                         r"\(pid \d+\) died mid-episode: killed by SIGKILL$", line) for line in said), said


UNPINNED = ("agentenv-nb-no-such-package>=1", "agentenv-nb-x @ file:///tmp/x.whl")


def _requiring(root: Path, requirement: str) -> Path:
    bundle = _bundle(root / requirement.split()[0].replace(">", "").replace("=", ""))
    (bundle / "envs" / "gridsim" / "requirements.txt").write_text(requirement + "\n")
    return bundle


def test_pip_install_takes_only_pinned_names(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENV_NB_PIP_INSTALL", "1")
    for requirement in UNPINNED:
        with pytest.raises(ImageError, match="installs only requirements pinned by name and version") as refused:
            AgentEnv.local(_requiring(tmp_path, requirement))
        assert requirement.split()[0] in str(refused.value)
    assert not list((tmp_path / "work").iterdir())  # refused before any env process started, nothing left


@pytest.mark.slow  # the serve command in fresh interpreters
def test_the_serve_command_refuses_an_unpinned_install_in_one_line(tmp_path):
    for requirement in UNPINNED:
        failed = subprocess.run([*SERVE, str(_requiring(tmp_path, requirement))], capture_output=True, text=True,
                                timeout=300, env={**os.environ, "AGENTENV_NB_PIP_INSTALL": "1"})
        assert failed.returncode == 2 and "installs only requirements pinned by name and version" in failed.stderr
        assert requirement.split()[0] in failed.stderr and failed.stderr.strip().count("\n") == 0


# The soak: faults injected, nothing lost that they didn't hit, nothing left behind

@pytest.mark.slow
def test_a_small_soak_with_env_kills_and_a_restart_loses_nothing_it_did_not_hit(tmp_path):
    """bench/soak.py at CI's size (its 200-episode run is in docs/benchmarks.md)."""
    soak = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
    done = subprocess.run([sys.executable, str(soak), "--episodes", "24", "--workers", "2", "--kills", "3",
                           "--restarts", "1"], capture_output=True, text=True, timeout=900)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and result["ok"], (result, done.stderr[-3000:])
    assert result["episodes"] == 24 and result["restarts"] == 1 and result["kills"] == 3
