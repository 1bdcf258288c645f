"""Modal credentials, where agent_env's Modal sandbox reads them: found in MODAL_TOKEN_ID/MODAL_TOKEN_SECRET,
``~/.modal.toml`` or Colab's secrets, and put in the environment.

    from agentenv_nb.envs.modal_credentials import load_modal_credentials
    load_modal_credentials(app_name="my-gridsim")   # raises, saying how to make a token, when none is found

``MODAL_CONFIG_PATH`` and ``MODAL_PROFILE`` are read as Modal reads them; AGENT_ENV_MODAL_APP_NAME names the
Modal app envs deploy under.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_ID, TOKEN_SECRET = "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"
APP_NAME = "AGENT_ENV_MODAL_APP_NAME"  # agent_env's Modal sandbox reads its app name here (default "agent-env")

MODAL_HOW_TO = (
    "Make a Modal token: run `modal token new` (it writes ~/.modal.toml), or on modal.com open Settings -> API "
    "tokens -> New token. Then give it to the kit in one of three ways: set the environment variables "
    "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET; or keep ~/.modal.toml (`modal token set --token-id ID --token-secret "
    "SECRET` writes it); or, on Colab, add the secrets MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (key icon on the left, "
    "with notebook access on).")


class ModalCredentialsError(RuntimeError):
    """No Modal token was found, or the one found can't be read; the message says what to do."""


@dataclass(frozen=True)
class ModalCredentials:
    """A Modal token and where it was found; the secret stays out of ``repr``."""

    token_id: str
    token_secret: str = field(repr=False)
    source: str


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
        raise ModalCredentialsError(f"{path} isn't valid TOML ({error}); fix it or write it again with "
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
    Without credentials raise ModalCredentialsError saying how to make a token (or return None unless ``required``)."""
    found = find_modal_credentials()
    if found is None:
        if required:
            raise ModalCredentialsError(missing_modal_message())
        return None
    os.environ[TOKEN_ID], os.environ[TOKEN_SECRET] = found.token_id, found.token_secret
    if app_name:
        os.environ[APP_NAME] = app_name
    return found
