"""Where a bundle's envs run: Docker where an engine answers, else Modal where credentials are found, else local
processes when every env is a plain-Python server (the kit's ``process`` sandbox). The choice is printed with its
reason::

    from agentenv_nb.envs.choice import choose_sandbox
    choice = choose_sandbox("bundles/gridsim-v1")      # prints e.g. "envs run on modal: no Docker engine answers ..."
    app = build_app("bundles/gridsim-v1", sandbox=choice.name)

``AGENTENV_NB_SANDBOX`` forces a sandbox as ``force=`` does; ``DOCKER_HOST`` is the engine probed (default
``unix:///var/run/docker.sock``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

from agentenv_nb import settings
from agentenv_nb.envs.process import sandbox as process_sandbox
from agentenv_nb.envs.modal_credentials import ModalCredentialsError, load_modal_credentials, missing_modal_message
from agentenv_nb.stops import Stop

DOCKER, MODAL, PROCESS = "local", "modal", process_sandbox.NAME  # agent_env's names: "local" is its Docker sandbox
AUTO = "auto"  # the notebooks' and the command's word for no sandbox forced: the one chosen for the bundle
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


class SandboxError(Stop, RuntimeError):
    """No sandbox can run the bundle's envs here, or the forced one can't; the message says what to do."""


@dataclass(frozen=True)
class Choice:
    """The sandbox a server deploys the bundle's envs on (``build_app(sandbox=name)``) and why it was chosen."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"envs run on {self.name}: {self.reason}"


def docker_engine(host: str | None = None, timeout: float = 2.0) -> tuple[bool, str]:
    """Whether a Docker engine answers at ``host`` (default ``DOCKER_HOST``, else the local socket), and what was
    seen: ``GET /_ping`` on a unix or tcp host; ``docker info`` through the CLI for any other (ssh://, TLS), and
    when no host was named and the socket is silent, since the CLI may use a context (Docker Desktop's)."""
    named = host or os.environ.get("DOCKER_HOST")
    host = named or DEFAULT_DOCKER_HOST
    if host.startswith(("unix://", "tcp://")) and not os.environ.get("DOCKER_TLS_VERIFY"):
        ok, seen = _ping(host, timeout)
        if ok or named or shutil.which("docker") is None:
            return ok, seen
    if shutil.which("docker") is None:
        return False, f"DOCKER_HOST is {host} and there is no docker CLI to reach it"
    env = {**os.environ, "DOCKER_HOST": named} if named else None
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=timeout * 5, env=env)
    except subprocess.TimeoutExpired:
        return False, f"`docker info` didn't answer in {timeout * 5:.0f} s"
    if done.returncode == 0:
        return True, f"a Docker engine answers `docker info` (version {done.stdout.strip()})"
    return False, f"no Docker engine answers `docker info` ({done.stderr.strip()[-200:]})"


def _ping(host: str, timeout: float) -> tuple[bool, str]:
    """``GET /_ping`` on a ``unix://`` or ``tcp://`` Docker host, as the Docker CLI does first."""
    unix = host.startswith("unix://")
    transport = httpx.HTTPTransport(uds=host.removeprefix("unix://")) if unix else None
    try:
        with httpx.Client(transport=transport, timeout=timeout, trust_env=False) as client:
            reply = client.get(("http://docker" if unix else "http://" + host.removeprefix("tcp://")) + "/_ping")
    except httpx.HTTPError as error:
        return False, f"no Docker engine answers at {host} ({type(error).__name__})"
    if reply.status_code == 200:
        return True, f"a Docker engine answers at {host}"
    return False, f"{host} answers /_ping with HTTP {reply.status_code}, not a working Docker engine"


def choose_sandbox(bundle: str | Path, force: str | None = None, docker_host: str | None = None,
                   echo: bool = True) -> Choice:
    """The sandbox for ``bundle``'s envs: Docker where an engine answers, else Modal when credentials are found,
    else local processes when every env is a plain-Python server; raise SandboxError saying how to add Modal
    credentials when none fits. ``force`` (or AGENTENV_NB_SANDBOX) picks one, checked where it can be; ``"auto"``
    is none. Prints the choice and its reason unless ``echo`` is False; Modal credentials found go into the
    environment."""
    force = next((name for name in (force, settings.get("sandbox")) if name not in (None, "", AUTO)), None)
    choice = _forced(bundle, force, docker_host) if force else _automatic(bundle, docker_host)
    if echo:
        print(f"agentenv_nb: {choice}")
    return choice


def _forced(bundle: str | Path, force: str, docker_host: str | None) -> Choice:
    """The forced sandbox, refused only where it can't work: Modal without credentials, processes for an env
    that isn't plain Python. A Docker engine that doesn't answer here may still be reachable (a docker context),
    so it is said, not refused."""
    if force == MODAL:
        try:
            found = load_modal_credentials()
        except ModalCredentialsError as e:
            raise SandboxError(str(e)) from None
        return Choice(MODAL, f"forced; Modal credentials from {found.source}")
    if force == PROCESS:
        if problems := process_sandbox.problems(bundle):
            raise SandboxError("sandbox 'process' was forced, but these envs aren't plain-Python servers: "
                               + "; ".join(f"{name}: {why}" for name, why in problems.items()))
        return Choice(PROCESS, "forced; every env is a plain-Python server")
    if force == DOCKER:
        ok, seen = docker_engine(docker_host)
        if ok:
            return Choice(DOCKER, f"forced; {seen}")
        instead = ("; every env is a plain-Python server, so the kit's process sandbox runs them without Docker "
                   "(sandbox='process', --sandbox process)" if not process_sandbox.problems(bundle) else "")
        return Choice(DOCKER, f"forced; {seen}, so deploys will fail unless it starts{instead}")
    return Choice(force, "forced")


def _automatic(bundle: str | Path, docker_host: str | None) -> Choice:
    ok, seen = docker_engine(docker_host)
    if ok:
        return Choice(DOCKER, seen)
    found = load_modal_credentials(required=False)
    if found:
        return Choice(MODAL, f"{seen}; Modal credentials from {found.source}")
    problems = process_sandbox.problems(bundle)
    if not problems:
        return Choice(PROCESS, f"{seen}, no Modal credentials, and every env is a plain-Python server")
    listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
    raise SandboxError(f"Nowhere to run this bundle's envs: {seen}, and they aren't all plain-Python servers "
                       f"({listed}). {missing_modal_message('no Docker engine answers here')} Or run the server "
                       "on a host with Docker (docs/env-host.md).")

