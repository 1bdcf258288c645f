"""The work dir (AGENTENV_NB_WORK_DIR): where env images are unpacked and env processes, server logs and stores get
folders. What runs in an episode is read from there, so it must be this user's alone: it is made 0700, and refused
when another user owns it or may write to it (a world-writable /var/tmp lets anyone make the folder first), or owns
or may write a folder above it (sticky ones, as /tmp, aside), who could swap it for another."""

from __future__ import annotations

import functools
import os
import shutil
import stat
from pathlib import Path

import psutil

from agentenv_nb import settings


_FIRST_ENV_UID, _ENV_UIDS = 2_000_000_000, 100_000_000  # ids no account has: each env process one at random


class WorkDirError(PermissionError):
    """A work dir another user could change; the message says what to do."""


def work_dir() -> Path:
    """The work dir, made private if missing, checked, and swept of what servers no longer running left there."""
    path = Path(settings.get("work_dir"))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    _check(path)
    _sweep(path)
    share_with_envs(path, 0o710)  # entered, never listed
    return path


def _check(path: Path) -> None:
    """Refuse ``path`` when someone else owns it or may write it, or any folder above it (see below)."""
    fix = f"set AGENTENV_NB_WORK_DIR to a folder of your own, or remove {path} and let the kit make it"
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise WorkDirError(f"the work dir {path} isn't a folder (a link or a file); {fix}")
    if info.st_uid != os.geteuid():
        raise WorkDirError(f"the work dir {path} belongs to user id {info.st_uid}, not this user "
                           f"({os.geteuid()}), who would run what it holds; {fix}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise WorkDirError(f"the work dir {path} may be written by others (mode {stat.filemode(info.st_mode)}); {fix}")
    # A folder above it that another user owns, or others may write (unless sticky), lets them move it away and put
    # another in its place: every one, up to /, as written and with its links followed
    for parent in dict.fromkeys([*path.parents, *path.resolve().parents]):
        above = parent.stat()
        if above.st_uid not in (os.geteuid(), 0):
            raise WorkDirError(f"{parent}, above the work dir, belongs to user id {above.st_uid}, who could replace "
                               f"the work dir; {fix}")
        if above.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not above.st_mode & stat.S_ISVTX:
            raise WorkDirError(f"{parent}, above the work dir, may be written by others (mode "
                               f"{stat.filemode(above.st_mode)}), who could replace the work dir; {fix}")


def share_with_envs(path: Path, mode: int = 0o750) -> None:
    """As root, let the env processes' group (``env_ids``) enter ``path`` (and, by ``mode``, read it), never write it;
    elsewhere env processes run as this user, and nothing changes."""
    if (ids := env_ids()) is not None:
        os.chown(path, -1, ids[1])
        os.chmod(path, mode)


def env_ids() -> tuple[int, int] | None:
    """As root, a user id of its own for one env process and the group all share (AGENTENV_NB_ENV_USER's, default
    nobody's); None when the server isn't root, so env processes run as its user."""
    if os.geteuid() != 0:
        return None
    import pwd
    import secrets

    name = settings.get("env_user")
    try:
        group = pwd.getpwnam(name).pw_gid
    except KeyError:
        raise WorkDirError(f"AGENTENV_NB_ENV_USER={name!r} isn't a user here; name one (env processes run in its "
                           "group, each as a user id of its own)") from None
    return _FIRST_ENV_UID + secrets.randbelow(_ENV_UIDS), group


@functools.cache
def _sweep(path: Path) -> None:
    """Remove the folders a server that no longer runs left in ``path``, once per path."""
    for left in path.glob("agentenv-nb-*-*-*"):
        if (owner := left.name.split("-")[3]).isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(left, ignore_errors=True)


def owned_prefix(kind: str) -> str:
    """A folder's name prefix: its kind and this server's pid, which tells a later server whether this one runs."""
    return f"agentenv-nb-{kind}-{os.getpid()}-"
