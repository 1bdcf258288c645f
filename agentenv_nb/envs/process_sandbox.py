"""The ``process`` sandbox provider: a bundle's plain-Python MCP env runs as a local process, with no Docker.

It's an ``agent_env.sandbox_providers`` plugin (this package's entry point), chosen by name as ``modal`` is::

    from agent_env.openenv import build_app
    app = build_app("bundles/gridsim-v1", sandbox="process", max_concurrent_envs=32)

    agent-env run ./my-bundle --sandbox process

``problems(bundle)`` says which envs of a bundle can't run so, and why. The env must deploy as one server, not
behind a gateway: its ``envs/<name>/env.toml`` says ``env_provider_type = "server"``. Its Dockerfile must be one a
process can be (``image.RUNS``): a line it
can't run is refused by number, and a requirement this Python lacks is refused by name, with the command that
installs it. Each deploy gets a process no episode used, killed with its process group and folder when the episode
ends or fails, its TTL passes, or the server stops; ``pool`` keeps some started ahead of need. As root a process
gets its own /data, where a task's ``load_artifact`` stages its file for the env's data plane, and its own /tmp.

Settings, from ``[sandbox.providers.process] config = {...}`` in ``.agentenv/config.toml`` or the environment
(``agentenv_nb.settings``): ``pool`` (AGENTENV_NB_ENV_POOL), the processes kept ready per env, forked from a parent
that imported its libraries, 0 to start each as a fresh interpreter when asked; ``pip_install``
(AGENTENV_NB_PIP_INSTALL), to install missing requirements instead of refusing; ``start_timeout``
(AGENTENV_NB_ENV_START_TIMEOUT); and AGENTENV_NB_WORK_DIR, where images and processes' folders go.
"""

from __future__ import annotations

import asyncio
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
from agentenv_nb.envs.image import EnvImage, dockerfile_problem, read_image, remove_images
from agentenv_nb.envs.pool import EnvProcess, close_pools, pool_for
from agentenv_nb.lifecycle import close_at_exit

NAME = "process"
_live: dict[str, ProcessSandbox] = {}  # every sandbox not yet terminated, by id: a deploy's teardown finds it here
_images: dict[str, EnvImage] = {}  # each image prepare_image read, by image_name, for create_sandbox


class ProcessSandbox(Sandbox):
    """One env process, published at the port its image's container would listen on."""

    type = NAME
    mode = SANDBOX_MODE_CONTAINER
    platform = None  # runs this machine's Python, whatever platform the image names
    vnc_url = None

    def __init__(self, process: EnvProcess, port: int, ttl_seconds: float):
        self.process = process
        self.sandbox_id = f"{NAME}-{process.pid}-{uuid.uuid4().hex[:8]}"
        self.tunnel_urls = {port: process.url}
        self._port = port
        self._expiry = asyncio.get_running_loop().call_later(
            ttl_seconds, lambda: asyncio.ensure_future(self.terminate()))

    def host_port(self, port: int) -> int:
        return self.process.port if port == self._port else port

    async def terminate(self) -> None:
        """Kill the process's group and remove its folder; terminating again does nothing."""
        self._expiry.cancel()
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

    async def create_sandbox(self, *, image_name: str, port: int, env: dict[str, str], cpu: float = 1.0,
                             memory: int = 8192, disk_size_gb: float = 10, timeout: int = 3600 * 2,
                             attribution: Optional[dict] = None, network_policy: Any = None) -> ProcessSandbox:
        """A process of the image, serving its env card on loopback, as ``tunnel_urls[port]``."""
        refuse_unenforceable_policy(self, network_policy)
        image = _images.get(image_name)
        if image is None:
            raise ValueError(f"the process sandbox runs only an env image built from a bundle's Dockerfile, which the "
                             f"deploy prepares first; {image_name!r} isn't one")
        process = await pool_for(image, env, self.pool).take(self.start_timeout)
        sandbox = ProcessSandbox(process, port, timeout)
        _live[sandbox.sandbox_id] = sandbox
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> ProcessSandbox:
        try:
            return _live[sandbox_id]
        except KeyError:
            raise SandboxNotFoundError(f"no process sandbox {sandbox_id} is running here") from None


def problems(bundle: str | Path) -> dict[str, str]:
    """Why each env of ``bundle`` can't run as a local process, by env name; empty when every one can. Its
    requirements are checked when a server deploys it."""
    found = {}
    for name, folder in bundle_envs(bundle).items():
        config = folder / "env.toml"
        kind = tomllib.loads(config.read_text()).get("env_provider_type") if config.is_file() else None
        if kind != "server":
            found[name] = (f"envs/{name}/env.toml doesn't say env_provider_type = \"server\", so it deploys behind "
                           "a gateway, which needs Docker or a cloud sandbox")
        elif problem := dockerfile_problem(folder):
            found[name] = problem
    return found


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


def close_all() -> None:
    """Kill every env process still running, close the pools and remove the unpacked images."""
    for sandbox in list(_live.values()):
        _live.pop(sandbox.sandbox_id, None)
        sandbox.process.kill()
    close_pools()
    remove_images()


close_at_exit(close_all)
