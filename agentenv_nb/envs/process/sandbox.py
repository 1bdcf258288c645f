"""The ``process`` sandbox provider: a bundle's plain-Python MCP env runs as a local process, with no Docker.

It's an ``agent_env.sandbox_providers`` plugin (this package's entry point), chosen by name as ``modal`` is::

    from agent_env.openenv import build_app
    app = build_app("bundles/gridsim-v1", sandbox="process", max_concurrent_envs=32)

    agent-env run ./my-bundle --sandbox process

``problems(bundle)`` says which envs of a bundle can't run so, and why. The env must deploy as one server, not behind a
gateway: its ``envs/<name>/env.toml`` says ``env_provider_type = "server"``. Its Dockerfile must be one a process can be
(``dockerfile.RUNS``): a line it can't run is refused by number, and a requirement this Python lacks is refused by name,
with the command that installs it; a server checks every env so as it starts (``envs.resolve``). Each deploy gets a
process no episode used, killed with its process group and folder when the episode ends or fails, its TTL passes, or the
server stops (a server on a thread: ``release``); ``pool`` keeps some started ahead of need. As root a process gets its
own /data, where a task's ``load_artifact`` stages its file for the env's data plane, and its own /tmp.

Settings, from ``[sandbox.providers.process] config = {...}`` in ``.agentenv/config.toml`` or the environment
(``agentenv_nb.settings``): ``pool`` (AGENTENV_NB_ENV_POOL, which a server process caps at the sessions it holds), the
processes kept ready per env, forked from a parent that imported its libraries, 0 to start each as a fresh interpreter
when asked; ``pip_install``
(AGENTENV_NB_PIP_INSTALL), to install missing requirements instead of refusing; ``start_timeout``
(AGENTENV_NB_ENV_START_TIMEOUT); and AGENTENV_NB_WORK_DIR, where images and processes' folders go.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sys
import tempfile
import threading
import tomllib
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Optional

from agent_env.config import get_config
from agent_env.providers.sandbox_providers.sandbox import Sandbox
from agent_env.providers.sandbox_providers.sandbox_provider import (
    SANDBOX_MODE_CONTAINER,
    Accepts,
    SandboxNotFoundError,
    SandboxProvider,
    refuse_unenforceable_policy,
)

from agentenv_nb import settings
from agentenv_nb.envs.process import deaths
from agentenv_nb.envs.process.dockerfile import dockerfile_problem, read_dockerfile
from agentenv_nb.envs.process.image import EnvImage, read_image, remove_images
from agentenv_nb.envs.process.pool import EnvProcess, Pool, close_pools, pool_for
from agentenv_nb.lifecycle import close_at_exit

NAME = "process"
_WATCH_S = 0.5  # how often a running sandbox checks that its process lives
_live: dict[str, ProcessSandbox] = {}  # every sandbox not yet terminated, by id: a deploy's teardown finds it here
_images: dict[str, EnvImage] = {}  # each image prepare_image read, by image_name, for create_sandbox
# Which servers use each image and pool, by the thread their event loop runs on: a server's release() closes those
# no other server uses, so servers in one process share them and none stops another's.
_users: dict[str | Pool, set[int]] = {}
_users_lock = threading.Lock()


def _used_by_this_server(used: str | Pool) -> None:
    with _users_lock:
        _users.setdefault(used, set()).add(threading.get_ident())


class ProcessSandbox(Sandbox):
    """One env process, published at the port its image's container would listen on."""

    type = NAME
    mode = SANDBOX_MODE_CONTAINER
    platform = None  # runs this machine's Python, whatever platform the image names
    vnc_url = None

    def __init__(self, process: EnvProcess, port: int, ttl_seconds: float, name: str):
        self.process, self.server, self.name = process, threading.get_ident(), name
        self.sandbox_id = f"{NAME}-{process.pid}-{uuid.uuid4().hex[:8]}"
        self.tunnel_urls = {port: process.url}
        self._port = port
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(ttl_seconds, lambda: asyncio.ensure_future(self.terminate()))
        watching = deaths.listener()
        self._watch = loop.call_later(_WATCH_S, self._check_alive, watching, watching.resets if watching else 0)

    def _check_alive(self, watching: deaths.Watch | None, reset: int) -> None:
        """Every ``_WATCH_S``, until it's terminated: report the process's death to its episode (that of the
        connection's reset number ``reset``)."""
        if self.sandbox_id not in _live:
            return
        if self.process.alive():
            self._watch = asyncio.get_running_loop().call_later(_WATCH_S, self._check_alive, watching, reset)
            return
        how = self.process.how_it_ended()
        said = f"; its output ends: {self.process.output(300).strip()!r}" if "status" in how else ""
        deaths.report(watching, f"the env process of {self.name!r} (pid {self.process.pid}) died mid-episode: "
                      f"{how}{said}", reset)

    def host_port(self, port: int) -> int:
        return self.process.port if port == self._port else port

    async def terminate(self) -> None:
        """Kill the process's group and remove its folder; terminating again does nothing."""
        self._expiry.cancel()
        self._watch.cancel()
        if _live.pop(self.sandbox_id, None) is not None:
            try:
                await asyncio.to_thread(self.process.kill)
            except RuntimeError:  # Python is exiting and its thread pools are shut: kill it from here
                self.process.kill()

    async def write_file_from_object(self, object_url: str, destination_path: str) -> None:
        """Stage an object-store object at ``destination_path`` under /data or /tmp, as the process sees them."""
        path = self._host_path(destination_path)
        store = get_config().get_object_store_at(object_url)
        await asyncio.to_thread(store.download_to_file, object_url, str(path))

    async def write_file_from_text(self, content: str, destination_path: str) -> None:
        path = self._host_path(destination_path)
        await asyncio.to_thread(path.write_text, content, "utf8")

    def _host_path(self, destination_path: str) -> Path:
        """Where a file the process reads at ``destination_path`` is written on this host."""
        parts = PurePosixPath(destination_path).parts
        if len(parts) < 3 or parts[0] != "/" or parts[1] not in ("data", "tmp") or ".." in parts:
            raise ValueError(f"a process sandbox stages files only under /data or /tmp, not at {destination_path}")
        if not self.process.private:
            raise RuntimeError(
                f"can't stage {destination_path} for the env: a process gets its own /data only in a mount namespace, "
                "which needs root; run the server as root (as Colab does), or deploy this env on Docker "
                "(--sandbox local)")
        path = self.process.root.joinpath(*parts[1:])
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


class ProcessSandboxProvider(SandboxProvider):
    """Runs each env container a deploy asks for as a fresh local process (see the module docstring)."""

    # What an image is to it: a build context, which it reads (prepare_image) rather than builds.
    CONTAINER_ACCEPTS: ClassVar[Accepts] = Accepts.NAME_OR_CONTEXT
    SANDBOX_ACCEPTS: ClassVar[Accepts] = Accepts.NAME_OR_CONTEXT
    # In the framework's sense, "on this machine" means containers on this machine's Docker: the run then checks for
    # a Docker daemon and builds images with it. A process needs neither, so it declares itself elsewhere.
    ON_THIS_MACHINE: ClassVar[bool] = False

    def __init__(self, pool: int | None = None, pip_install: bool | None = None,
                 start_timeout: float | None = None):
        self.pool = settings.get("env_pool", pool)
        self.pip_install = settings.get("pip_install", pip_install)
        self.start_timeout = settings.get("env_start_timeout", start_timeout)

    async def prepare_image(self, image, *, attribution: Optional[dict] = None) -> None:
        """Read the image's Dockerfile and check its requirements, once per build context."""
        if image.image_name not in _images:
            _images[image.image_name] = await asyncio.to_thread(read_image, image, pip_install=self.pip_install)
        _used_by_this_server(_images[image.image_name].key)

    async def create_sandbox(self, *, image_name: str, port: int, env: dict[str, str], cpu: float = 1.0,
                             memory: int = 8192, disk_size_gb: float = 10, timeout: int = 3600 * 2,
                             attribution: Optional[dict] = None, network_policy: Any = None) -> ProcessSandbox:
        """A process of the image, serving its env card on loopback, as ``tunnel_urls[port]``."""
        refuse_unenforceable_policy(self, network_policy)
        image = _images.get(image_name)
        if image is None:
            raise ValueError(f"the process sandbox runs only an env image built from a bundle's Dockerfile, which the "
                             f"deploy prepares first; {image_name!r} isn't one")
        pool = pool_for(image, env, self.pool)
        _used_by_this_server(pool)
        process = await pool.take(self.start_timeout)
        sandbox = ProcessSandbox(process, port, timeout, env.get("ENVIRONMENT_NAME", image_name))
        _live[sandbox.sandbox_id] = sandbox
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> ProcessSandbox:
        try:
            return _live[sandbox_id]
        except KeyError:
            raise SandboxNotFoundError(f"no process sandbox {sandbox_id} is running here") from None


def problems(bundle: str | Path, pip_install: bool | None = None) -> dict[str, str]:
    """Why each env of ``bundle`` can't run as a local process, by env name; empty when every one can. With
    ``pip_install`` given, a requirement this Python lacks is a problem too (or is installed, when True)."""
    found = {}
    for name, folder in bundle_envs(bundle).items():
        config = folder / "env.toml"
        kind = tomllib.loads(config.read_text()).get("env_provider_type") if config.is_file() else None
        if kind != "server":
            found[name] = (f"envs/{name}/env.toml doesn't say env_provider_type = \"server\", so it deploys behind "
                           "a gateway, which needs Docker or a cloud sandbox; if its image is one MCP server, write "
                           f"envs/{name}/env.toml with the line env_provider_type = \"server\" to run it as a process")
        elif problem := dockerfile_problem(folder, pip_install):
            found[name] = problem
    return found


# The envs this process has started in a trial, by ``_started_as``: a notebook's serve cell run again, or another
# server of the same bundle, doesn't pay an env's start-up (seconds of imports) to learn what it already knows.
_TRIED: set[str] = set()


def _started_as(folder: Path) -> str:
    """What an env's start depends on: every file of its folder (its Dockerfile and code, byte for byte), whether
    missing requirements are installed, and this Python."""
    digest = hashlib.sha256(f"{settings.get('pip_install')}\0{sys.executable}".encode())
    for path in sorted(found for found in folder.rglob("*") if found.is_file()):
        digest.update(f"\0{path.relative_to(folder)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def trial(bundle: str | Path) -> None:
    """Start each env of ``bundle`` once as an episode would, and stop it: raise ImageError for a requirement this
    Python lacks (installed instead with AGENTENV_NB_PIP_INSTALL=1), and EnvStartError with the env's name and output
    when one exits or doesn't listen (an import error, say), so the server doesn't start to fail every episode. An env
    this process already started, unchanged, isn't started again."""
    import concurrent.futures

    from agentenv_nb.envs.process.pool import EnvStartError, Pool
    from agentenv_nb.envs.workdir import owned_prefix, share_with_envs, work_dir

    timeout, scratches = settings.get("env_start_timeout"), work_dir()  # a work dir others may write is refused first

    async def start(image: EnvImage, name: str) -> None:
        (await Pool(image, {"ENVIRONMENT_NAME": name}, 0).take(timeout)).kill()

    for name, folder in bundle_envs(bundle).items():
        if (started_as := _started_as(folder)) in _TRIED:
            continue
        scratch = Path(tempfile.mkdtemp(prefix=owned_prefix("trial"), dir=scratches))
        try:
            share_with_envs(scratch)
            read = read_dockerfile(f"envs/{name}/Dockerfile", folder, scratch / "app",
                                   pip_install=settings.get("pip_install"))
            image = EnvImage(f"trial:{name}", scratch / "app", read.script, read.args, read.env)
            with concurrent.futures.ThreadPoolExecutor(1) as thread:  # a loop of its own, even inside a notebook's
                thread.submit(asyncio.run, start(image, name)).result()
            _TRIED.add(started_as)
        except EnvStartError as e:
            raise EnvStartError(f"env {name!r} of {bundle} can't start as a local process: {e}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def bundle_envs(bundle: str | Path) -> dict[str, Path]:
    """The env folders of ``bundle`` (a folder, or an installed bundle's name), by env name."""
    root = Path(bundle)
    if not root.is_dir():
        from agent_env.bundle.installed import locate_bundle

        root = Path(locate_bundle(str(bundle))[0])
    folder = root / "envs"
    return {path.name: path for path in sorted(folder.iterdir()) if path.is_dir()} if folder.is_dir() else {}


def running() -> int:
    """How many process sandboxes are running here: created, and not yet terminated."""
    return len(_live)


def release(server: int) -> None:
    """Forget that the server whose event loop runs on the thread ``server`` uses its images and pools, kill its env
    processes still running, and close the images and pools no other server uses."""
    _kill([sandbox for sandbox in _live.values() if sandbox.server == server])
    with _users_lock:
        for users in _users.values():
            users.discard(server)
        unused = [used for used, users in _users.items() if not users]
        for used in unused:
            del _users[used]
    for pool in (used for used in unused if isinstance(used, Pool)):
        pool.close()
    keys = {used for used in unused if isinstance(used, str)}
    for name in [name for name, image in _images.items() if image.key in keys]:
        del _images[name]
    remove_images(keys)


def close_all() -> None:
    """Kill every env process still running, close the pools and remove the unpacked images."""
    _kill(list(_live.values()))
    close_pools()
    remove_images()
    _images.clear()
    _users.clear()



def _kill(sandboxes: list[ProcessSandbox]) -> None:
    for sandbox in sandboxes:
        _live.pop(sandbox.sandbox_id, None)
        sandbox.process.kill()


close_at_exit(close_all)
