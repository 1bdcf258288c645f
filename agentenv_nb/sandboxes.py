"""Where a bundle's envs run (Docker, Modal or local processes), and the Modal credentials agent_env needs.

A notebook host has no Docker engine, so a bundle's envs run on Modal when credentials are found, or as local
processes when every env is a plain-Python server (the kit's ``process`` sandbox), and the choice is printed
with its reason. Credentials come from MODAL_TOKEN_ID/MODAL_TOKEN_SECRET, ``~/.modal.toml`` or Colab's secrets
and are put in the environment, where agent_env's Modal sandbox reads them::

    from agentenv_nb.sandboxes import choose_sandbox, load_modal_credentials

    load_modal_credentials(app_name="my-gridsim")      # raises, saying how to make a token, when none is found
    choice = choose_sandbox("bundles/gridsim-v1")      # prints e.g. "envs run on modal: no Docker engine answers ..."
    app = build_app("bundles/gridsim-v1", sandbox=choice.name)

Settings: ``AGENTENV_NB_SANDBOX`` forces a sandbox as ``force=`` does; ``DOCKER_HOST`` is the engine probed
(default ``unix:///var/run/docker.sock``); ``MODAL_CONFIG_PATH`` and ``MODAL_PROFILE`` as Modal reads them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx

TOKEN_ID, TOKEN_SECRET = "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"
APP_NAME = "AGENT_ENV_MODAL_APP_NAME"  # agent_env's Modal sandbox reads its app name here (default "agent-env")
FORCE = "AGENTENV_NB_SANDBOX"
DOCKER, MODAL, PROCESS = "local", "modal", "process"  # agent_env's sandbox names: "local" is its Docker sandbox
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"

MODAL_HOW_TO = (
    "Make a Modal token: run `modal token new` (it writes ~/.modal.toml), or on modal.com open Settings -> API "
    "tokens -> New token. Then give it to the kit in one of three ways: set the environment variables "
    "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET; or keep ~/.modal.toml (`modal token set --token-id ID --token-secret "
    "SECRET` writes it); or, on Colab, add the secrets MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (key icon on the left, "
    "with notebook access on).")


class SandboxError(RuntimeError):
    """No sandbox can run the bundle's envs here, or the forced one can't; the message says what to do."""


@dataclass(frozen=True)
class ModalCredentials:
    """A Modal token and where it was found; the secret stays out of ``repr``."""

    token_id: str
    token_secret: str = field(repr=False)
    source: str


@dataclass(frozen=True)
class Choice:
    """The sandbox a server deploys the bundle's envs on (``build_app(sandbox=name)``) and why it was chosen."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"envs run on {self.name}: {self.reason}"


def modal_config_path() -> Path:
    """The ``.modal.toml`` Modal reads: ``MODAL_CONFIG_PATH``, else the home folder's."""
    return Path(os.environ.get("MODAL_CONFIG_PATH") or Path.home() / ".modal.toml")


def _from_toml() -> ModalCredentials | None:
    """The token of ``.modal.toml``'s profile as Modal picks it: ``MODAL_PROFILE``, else the active one, else
    ``default``. Read here rather than through ``modal.config``, which reads the file once, when imported."""
    path = modal_config_path()
    if not path.is_file():
        return None
    try:
        profiles = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SandboxError(f"{path} isn't valid TOML ({error}); fix it or write it again with "
                           "`modal token set --token-id ID --token-secret SECRET`") from None
    active = [name for name, values in profiles.items() if isinstance(values, dict) and values.get("active")]
    name = os.environ.get("MODAL_PROFILE") or (active[0] if active else "default")
    profile = profiles.get(name)
    if isinstance(profile, dict) and profile.get("token_id") and profile.get("token_secret"):
        return ModalCredentials(profile["token_id"], profile["token_secret"], f"{path} [{name}]")
    return None


def _from_colab() -> ModalCredentials | None:
    """The token in Colab's secrets, when this runs on Colab and both secrets are there with notebook access."""
    try:
        from google.colab import userdata
    except ImportError:  # not on Colab
        return None
    try:
        values = [userdata.get(key) for key in (TOKEN_ID, TOKEN_SECRET)]
    except Exception:  # Colab's SecretNotFoundError / NotebookAccessError, defined only on Colab
        return None
    return ModalCredentials(*values, "Colab secrets") if all(values) else None


def find_modal_credentials() -> ModalCredentials | None:
    """Modal credentials from the environment, ``.modal.toml`` or Colab's secrets (in that order), or None."""
    token_id, token_secret = os.environ.get(TOKEN_ID), os.environ.get(TOKEN_SECRET)
    if token_id and token_secret:
        return ModalCredentials(token_id, token_secret, f"environment variables {TOKEN_ID}/{TOKEN_SECRET}")
    return _from_toml() or _from_colab()


def missing_modal_message(why: str = "envs deploy on Modal") -> str:
    """The message for a missing Modal token: what needs it, how to make one and where to put it."""
    return f"No Modal credentials found, and {why}. {MODAL_HOW_TO}"


def load_modal_credentials(app_name: str | None = None, required: bool = True) -> ModalCredentials | None:
    """Find Modal credentials and put them in MODAL_TOKEN_ID/MODAL_TOKEN_SECRET, where agent_env and Modal read
    them, before a server starts; ``app_name`` sets AGENT_ENV_MODAL_APP_NAME, the Modal app envs deploy under.
    Without credentials raise SandboxError saying how to make a token (or return None unless ``required``)."""
    found = find_modal_credentials()
    if found is None:
        if required:
            raise SandboxError(missing_modal_message())
        return None
    os.environ[TOKEN_ID], os.environ[TOKEN_SECRET] = found.token_id, found.token_secret
    if app_name:
        os.environ[APP_NAME] = app_name
    return found


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


def bundle_envs(bundle: str | Path) -> dict[str, Path]:
    """The env folders of ``bundle`` (a folder, or an installed bundle's name), by env name."""
    root = Path(bundle)
    if not root.is_dir():
        from agent_env.bundle.installed import locate_bundle

        root = Path(locate_bundle(str(bundle))[0])
    folder = root / "envs"
    return {path.name: path for path in sorted(folder.iterdir()) if path.is_dir()} if folder.is_dir() else {}


def process_problems(bundle: str | Path) -> dict[str, str]:
    """Why each env of ``bundle`` that can't run as a local process can't, by env name; empty when all can.
    The rule is the process sandbox's (``local_envs``): an env.toml with ``env_provider_type = "server"``, and a
    Dockerfile ``env_image`` reads as a plain-Python server. Its requirements are checked when the server starts."""
    from agentenv_nb.env_image import ImageError, _Dockerfile

    problems = {}
    for name, folder in bundle_envs(bundle).items():
        config = folder / "env.toml"
        kind = tomllib.loads(config.read_text()).get("env_provider_type") if config.is_file() else None
        if kind != "server":
            problems[name] = (f"envs/{name}/env.toml doesn't say env_provider_type = \"server\", so it deploys "
                              "behind a gateway, which needs Docker or a cloud sandbox")
            continue
        try:
            with tempfile.TemporaryDirectory() as scratch:  # the reader lays the image's files out in app/
                _Dockerfile(f"envs/{name}/Dockerfile", folder, Path(scratch) / "app").read(
                    (folder / "Dockerfile").read_text())
        except (ImageError, OSError) as error:
            problems[name] = str(error)
    return problems


def choose_sandbox(bundle: str | Path, force: str | None = None, docker_host: str | None = None,
                   echo: bool = True) -> Choice:
    """The sandbox for ``bundle``'s envs: Docker where an engine answers, else Modal when credentials are found,
    else local processes when every env is a plain-Python server; raise SandboxError saying how to add Modal
    credentials when none fits. ``force`` (or AGENTENV_NB_SANDBOX) picks one, checked where it can be.
    Prints the choice and its reason unless ``echo`` is False; Modal credentials found go into the environment."""
    force = force or os.environ.get(FORCE) or None
    choice = _forced(bundle, force, docker_host) if force else _automatic(bundle, docker_host)
    if echo:
        print(f"agentenv_nb: {choice}")
    return choice


def _forced(bundle: str | Path, force: str, docker_host: str | None) -> Choice:
    """The forced sandbox, refused only where it can't work: Modal without credentials, processes for an env
    that isn't plain Python. A Docker engine that doesn't answer here may still be reachable (a docker context),
    so it is said, not refused."""
    if force == MODAL:
        found = load_modal_credentials()
        return Choice(MODAL, f"forced; Modal credentials from {found.source}")
    if force == PROCESS:
        if problems := process_problems(bundle):
            raise SandboxError("sandbox 'process' was forced, but these envs aren't plain-Python servers: "
                               + "; ".join(f"{name}: {why}" for name, why in problems.items()))
        return Choice(PROCESS, "forced; every env is a plain-Python server")
    if force == DOCKER:
        ok, seen = docker_engine(docker_host)
        return Choice(DOCKER, f"forced; {seen}" + ("" if ok else ", so deploys will fail unless it starts"))
    return Choice(force, "forced")


def _automatic(bundle: str | Path, docker_host: str | None) -> Choice:
    ok, seen = docker_engine(docker_host)
    if ok:
        return Choice(DOCKER, seen)
    found = load_modal_credentials(required=False)
    if found:
        return Choice(MODAL, f"{seen}; Modal credentials from {found.source}")
    problems = process_problems(bundle)
    if not problems:
        return Choice(PROCESS, f"{seen}, no Modal credentials, and every env is a plain-Python server")
    listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
    raise SandboxError(f"Nowhere to run this bundle's envs: {seen}, and they aren't all plain-Python servers "
                       f"({listed}). {missing_modal_message('no Docker engine answers here')} Or run the server "
                       "on a host with Docker (docs/env-host.md).")

