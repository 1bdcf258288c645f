"""Every ``AGENTENV_NB_*`` setting of the kit, in one place: its default, its type and what it sets.

    from agentenv_nb import settings
    settings.get("call_timeout")           # 120.0, or what AGENTENV_NB_CALL_TIMEOUT says
    settings.get("port", given=8080)       # an argument wins over the environment

A value that doesn't parse, isn't finite, or is out of range, raises SettingError naming the variable and what it
takes; ``check_environment()`` reads every variable set, so a command or ``AgentEnv.local`` says so before it starts
anything. Notebook parameters are overridden the same way, ``AGENTENV_NB_<NAME>`` (``notebook.params``).
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv_nb.stops import Stop

PREFIX = "AGENTENV_NB_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingError(Stop, ValueError):
    """A setting whose value the kit can't use; the message names it and what it takes, in one line (a notebook shows
    that line, not a traceback)."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    kind: type
    what: str
    low: float | None = None
    high: float | None = None
    problem: Callable[[Any], str | None] | None = None  # why a value that parsed can't be used, or None
    choices: tuple | None = None  # the values it takes, where they are few
    secret: bool = False  # its value never appears in an error

    @property
    def variable(self) -> str:
        return PREFIX + self.name.upper()


def _host_problem(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return "isn't an IP address or a name this machine resolves"
    return None


MIN_TOKEN = 16  # characters: a shorter token beyond loopback is a guess away


def _token_problem(token: str) -> str | None:
    if len(token) < MIN_TOKEN:
        return (f"is shorter than {MIN_TOKEN} characters: anyone who reaches the server could guess it; use more, "
                "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))', or unset it to have one made")
    return None


def _work_dir_problem(path: str) -> str | None:
    folder = Path(path)
    if not folder.is_absolute():
        return "isn't an absolute path"
    if folder.parts[1:2] and folder.parts[1] in ("proc", "sys", "dev"):
        return f"is under /{folder.parts[1]}, which holds no folders of ours"
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder"
    return None


# Every number has both bounds: a huge finite one (1e10 seconds) passes a "finite" check and then overflows a
# clock or a timestamp deep in asyncio or threading, far from the variable that set it.
_HOUR, _DAY = 3600, 86400

SETTINGS = {setting.name: setting for setting in (
    Setting("reset_timeout", 300.0, float, "seconds a reset (an episode's deploy) may take", 0.001, _DAY),
    Setting("call_timeout", 120.0, float, "seconds a tool call or a turn's end may take", 0.001, _DAY),
    Setting("patience", 4.0, float, "seconds to connect, and to wait for a slot another session took", 0.001, _HOUR),
    Setting("env_pool", 8, int, "env processes kept started ahead of need, per env (0: start each when asked)", 0, 64),
    Setting("pip_install", False, bool, "install an env's missing requirements instead of refusing it"),
    Setting("env_start_timeout", 60.0, float, "seconds an env process has to serve its card", 0.001, _HOUR),
    Setting("work_dir", "/var/tmp/agentenv-nb", str, "where env images are unpacked and env processes get folders: "
            "an absolute path, private to this user", problem=_work_dir_problem),
    Setting("host", "127.0.0.1", str, "the address `python -m agentenv_nb.envs.serve` listens on (beyond loopback, a "
            "token is required)", problem=_host_problem),
    Setting("port", 8000, int, "the port `python -m agentenv_nb.envs.serve` listens on (0: any free one)", 0, 65535),
    Setting("sandbox", None, str, "where envs run: process, modal, local (Docker); unset: chosen for the bundle"),
    Setting("max_concurrent_envs", 8, int, "sessions a server plays at once: one per rollout in flight", 1, 4096),
    Setting("token", None, str, "the access token a server requires and a client sends (the serve command makes "
            "one when it listens beyond loopback)", problem=_token_problem, secret=True),
    Setting("idle_timeout", 600.0, float, "seconds a session may send nothing before the server closes it",
            low=1, high=_DAY),
    Setting("env_user", "nobody", str, "as root, the user whose group env processes share; each runs as a user id "
            "of its own"),
    Setting("store", None, str, "where a serving process (the serve command, AgentEnv.local) keeps agent_env's store "
            "of episodes (unset: a folder of its own in the work dir, removed when it exits)", problem=_work_dir_problem),
    Setting("bundles", str(Path(__file__).resolve().parents[1] / "bundles.txt"), str,
            "the list of bundles `get_bundle` knows"),
    Setting("library_log", "agentenv_nb.log", str, "the file where the libraries' own stderr and prints go while "
            "the kit loads, trains and saves (Unsloth's banner, vLLM's progress bars), instead of a notebook's cells"),
    Setting("gpu_memory_gb", None, float, "GB of GPU memory a training run may use, vLLM included (unset: the whole "
            "card, or what torch.cuda.set_per_process_memory_fraction allows)", low=1, high=100_000),
    Setting("stack", None, str, "the known package set the set-up step installs and preflight checks (unset: the one "
            "that fits this host)"),
    Setting("precision", None, str, "the precision a GPU preset trains in (unset: bf16 where the card computes in it, "
            "else fp16, as on a T4)", choices=("bf16", "fp16", "fp32")),
    Setting("vllm_weights", None, str, "the weights vLLM generates from and LoRA trains on where a preset lets the "
            "card choose (unset: the card's choice)", choices=("16bit", "fp8", "4bit")),
)}


def check_environment() -> None:
    """Read every ``AGENTENV_NB_*`` setting the environment sets: a bad one raises SettingError now."""
    for name in SETTINGS:
        get(name)


def get(name: str, given: Any = None) -> Any:
    """The setting ``name``: ``given`` when not None, else its environment variable, else its default."""
    setting = SETTINGS[name]
    if given is not None:
        return _checked(setting, given, name if setting.secret else f"{name}={given!r}")
    text = os.environ.get(setting.variable, "").strip()
    if not text:
        return setting.default
    return parse(name, text, setting.variable)


def parse(name: str, text: str, shown: str | None = None) -> Any:
    """The setting ``name`` from ``text``, checked: a command-line flag's value reads as the variable's does.
    ``shown`` names where the text came from in a SettingError (default: the variable)."""
    setting, shown = SETTINGS[name], shown or SETTINGS[name].variable
    return _checked(setting, parse_as(setting.kind, text.strip(), shown, setting.what),
                    shown if setting.secret else f"{shown}={text!r}")


def parse_as(kind: type, text: str, shown: str, what: str) -> Any:
    """``text`` read as a ``kind`` (bool, int, float or str), the way every ``AGENTENV_NB_*`` variable is read;
    SettingError naming ``shown`` (the variable) and ``what`` it sets where it doesn't parse."""
    if kind is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise SettingError(f"{shown}={text!r} isn't a yes or no; set it to 1 or 0 ({what})")
    try:
        return kind(text)
    except ValueError:
        named = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
        raise SettingError(f"{shown}={text!r} isn't {named}; set it to one, or unset it ({what})") from None


def _checked(setting: Setting, value: Any, shown: str) -> Any:
    if setting.kind in (int, float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise SettingError(f"{shown} isn't a finite number ({setting.what})")
        low, high = setting.low, setting.high
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"from {low:g} to {high:g}"
            raise SettingError(f"{shown} is out of range: {setting.name} takes a value {bounds} ({setting.what})")
    if setting.choices is not None and value not in setting.choices:
        raise SettingError(f"{shown} isn't one of {', '.join(setting.choices)} ({setting.what})")
    if setting.problem is not None and (problem := setting.problem(value)):
        raise SettingError(f"{shown} {problem} ({setting.what})")
    return value

