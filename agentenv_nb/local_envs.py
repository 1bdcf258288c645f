"""The ``process`` sandbox provider: a bundle's plain-Python MCP env runs as a local process, with no Docker.

It's an ``agent_env.sandbox_providers`` plugin (this package's entry point), chosen by name as ``modal`` is::

    from agent_env.openenv import build_app
    app = build_app("bundles/gridsim-v1", sandbox="process", max_concurrent_envs=32)

    agent-env run ./my-bundle --sandbox process

The env must deploy as one server, not behind a gateway: its ``envs/<name>/env.toml`` says
``env_provider_type = "server"``. Its Dockerfile must be one a process can be (``env_image.RUNS``): a line it
can't run is refused by number, and a requirement this Python lacks is refused by name, with the command that
installs it. Each deploy gets a process no episode used, killed with its process group and folder when the episode
ends or fails, its TTL passes, or the server stops; ``env_pool`` keeps some started ahead of need. As root a process
gets its own /data, where a task's ``load_artifact`` stages its file for the env's data plane, and its own /tmp.

Settings, from ``[sandbox.providers.process] config = {...}`` in ``.agentenv/config.toml`` or the environment:

- ``pool`` (``AGENTENV_NB_ENV_POOL``, default 8): processes kept ready per env, forked from a parent that imported
  its libraries, and more once more were in use at once; 0 starts each as a fresh interpreter when it's asked for.
- ``pip_install`` (``AGENTENV_NB_PIP_INSTALL=1``): install missing requirements into this Python instead of refusing.
- ``start_timeout`` (``AGENTENV_NB_ENV_START_TIMEOUT``, default 60): seconds a process has to serve its env card.
- ``AGENTENV_NB_WORK_DIR`` (default /var/tmp/agentenv-nb): where the unpacked images and the processes' folders go.
"""

from __future__ import annotations

import asyncio
import os
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

from agentenv_nb.env_image import EnvImage, read_image, remove_images
from agentenv_nb.env_pool import EnvProcess, close_pools, pool_for

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
            await asyncio.to_thread(self.process.kill)

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
        self.pool = int(_setting(pool, "AGENTENV_NB_ENV_POOL", 8))
        self.pip_install = str(_setting(pip_install, "AGENTENV_NB_PIP_INSTALL", "")).lower() in ("1", "true", "yes")
        self.start_timeout = float(_setting(start_timeout, "AGENTENV_NB_ENV_START_TIMEOUT", 60))
        if self.pool < 0:
            raise ValueError(f"pool is the number of env processes kept ready, 0 or more, not {self.pool}")

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


async def shutdown() -> None:
    """Terminate every process sandbox, then close the pools and remove the unpacked images."""
    await asyncio.gather(*(sandbox.terminate() for sandbox in list(_live.values())))
    await asyncio.to_thread(close_pools)
    await asyncio.to_thread(remove_images)


def _setting(given: Any, variable: str, default: Any) -> Any:
    return given if given is not None else os.environ.get(variable) or default
