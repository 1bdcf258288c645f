"""An env image read as a local process: its build context unpacked, its Dockerfile's COPYs laid out in one folder,
and its requirements checked against this Python, so a plain-Python MCP server runs without Docker.

Only a Dockerfile of these instructions reads this way: ``FROM python…``, ``WORKDIR``, ``COPY``, ``RUN pip install …``
(and ``useradd``), ``ENV``, ``USER``, ``EXPOSE``, ``LABEL`` and ``CMD ["python", "server.py"]``. Any other line is
refused by number, since the process would not be what Docker builds::

    from agentenv_nb.env_image import read_image
    image = read_image(docker_image_artifact, pip_install=False)   # blocking: call it off the event loop
    image.app_dir, image.script, image.env                          # the folder, the CMD's script, the ENV lines

``pip_install`` (``AGENTENV_NB_PIP_INSTALL=1`` through the sandbox) installs a requirement this Python lacks rather
than refusing the image. An installed version outside a requirement's range is only logged: the env runs in the
server's own Python, so replacing that version would change the server's packages too.
"""

from __future__ import annotations

import ast
import atexit
import functools
import glob
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from agent_env.config import get_config
from agent_env.utils.docker.context import extract
from agent_env.utils.docker.dockerfile import copy_arguments, instructions

logger = logging.getLogger(__name__)

RUNS = ('FROM python…, WORKDIR, COPY, RUN pip install … (or useradd), ENV, USER, EXPOSE, LABEL and '
        'CMD ["python", "server.py"]')
_NO_OPS = {"USER", "EXPOSE", "LABEL"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-f", "--find-links",
                      "--target", "-t", "--prefix", "--root", "--trusted-host", "--platform", "--python-version"}


class ImageError(ValueError):
    """An env image a local process can't run; the message says which line and what to do."""


@dataclass(frozen=True)
class EnvImage:
    """What a process needs to run an image: the folder its COPYs fill (its WORKDIR), the CMD's script and
    arguments, its ENV, and the modules its code imports from outside the folder, which a parent can import first."""

    key: str
    app_dir: Path
    script: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ()


_images: dict[str, EnvImage] = {}
_lock = threading.Lock()


def read_image(image, *, pip_install: bool = False) -> EnvImage:
    """The image a ``DockerImageArtifact`` with a build context describes, read once per source digest."""
    if not image.build_context_object_url or not image.dockerfile_path:
        raise ImageError(f"image {image.image_name!r} has no build context with a Dockerfile; a process sandbox runs "
                         "only an env built from a bundle's envs/<name>/Dockerfile")
    key = image.source_digest or f"{image.build_context_object_url}#{image.dockerfile_path}"
    with _lock:
        if key not in _images:
            _images[key] = _read(image, key, pip_install)
        return _images[key]


def work_dir() -> Path:
    """Where the unpacked images and the env processes' folders go: ``AGENTENV_NB_WORK_DIR``, else
    /var/tmp/agentenv-nb, outside the /tmp an env process gets of its own, where it couldn't see its app."""
    path = Path(os.environ.get("AGENTENV_NB_WORK_DIR") or "/var/tmp/agentenv-nb")
    path.mkdir(parents=True, exist_ok=True)
    _sweep(path)
    return path


@functools.cache
def _sweep(path: Path) -> None:
    """Remove the folders a server that no longer runs left in ``path``, once per path."""
    for left in path.glob("agentenv-nb-*-*-*"):
        owner = left.name.split("-")[3]
        if owner.isdigit() and not _running(int(owner)):
            shutil.rmtree(left, ignore_errors=True)


def owned_prefix(kind: str) -> str:
    """The name prefix of a folder this server makes: its kind and this process's pid, which tells a later server
    whether the one that made it still runs."""
    return f"agentenv-nb-{kind}-{os.getpid()}-"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_images() -> None:
    """Remove every folder ``read_image`` unpacked; a later read unpacks again."""
    with _lock:
        for read in _images.values():
            shutil.rmtree(read.app_dir.parent, ignore_errors=True)
        _images.clear()


atexit.register(remove_images)


def _read(image, key: str, pip_install: bool) -> EnvImage:
    work = Path(tempfile.mkdtemp(prefix=owned_prefix("image"), dir=work_dir()))
    try:
        archive, context, app = work / "context.tar.gz", work / "context", work / "app"
        get_config().get_object_store_at(image.build_context_object_url).download_to_file(
            image.build_context_object_url, str(archive))
        extract(archive, context)
        archive.unlink()
        where = f"image {image.id!r} ({image.dockerfile_path})"
        read = _Dockerfile(where, context, app).read((context / image.dockerfile_path).read_text("utf8"))
        _require(where, read.requirements, pip_install)
        return EnvImage(key=key, app_dir=app, script=read.script, args=read.args, env=read.env,
                        preload=_outside_imports(app))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


@dataclass
class _Dockerfile:
    """One pass over a Dockerfile: it fills ``app`` with what its COPYs copy from ``context``."""

    where: str
    context: Path
    app: Path
    workdir: str = "/"
    copies: list = field(default_factory=list)  # (line, CopyArguments, workdir)
    requirements: list = field(default_factory=list)  # (source, Requirement)
    pip_files: list = field(default_factory=list)  # (line, container path of a -r file)
    env: dict = field(default_factory=dict)
    script: Path | None = None
    args: tuple = ()

    def read(self, text: str) -> _Dockerfile:
        line, froms, cmd = 1, 0, None
        for instruction in instructions(text):
            at, line = line, line + instruction.text.count("\n")
            if instruction.keyword is None:
                continue
            shown = f"{self.where} line {at}: {instruction.text.strip()!r}"
            keyword, arguments = instruction.keyword, instruction.arguments
            if keyword == "FROM":
                froms += 1
                self._from(shown, arguments, froms)
            elif keyword == "WORKDIR":
                self.workdir = posixpath.normpath(posixpath.join(self.workdir, arguments.strip()))
            elif keyword == "COPY":
                args = copy_arguments(instruction)
                if args is None or args.heredoc or any(f.startswith("--from") for f in args.flags):
                    raise ImageError(f"{shown}: a process sandbox copies only files of the build context")
                self.copies.append((shown, args, self.workdir))
            elif keyword == "RUN":
                self._run(shown, arguments)
            elif keyword == "ENV":
                self._env(shown, arguments)
            elif keyword == "CMD":
                cmd = (shown, arguments, self.workdir)
            elif keyword not in _NO_OPS:
                raise ImageError(f"{shown}: a process sandbox runs only a Dockerfile of {RUNS}; run this env on "
                                 "Docker (--sandbox local) or a cloud sandbox (--sandbox modal)")
        if cmd is None:
            raise ImageError(f"{self.where} has no CMD; a process sandbox runs CMD [\"python\", \"server.py\"]")
        self.app.mkdir()
        for shown, args, workdir in self.copies:
            self._copy(shown, args, workdir)
        for shown, path in self.pip_files:
            self.requirements += _requirements_file(shown, self._in_app(shown, path))
        self._cmd(*cmd)
        return self

    def _from(self, shown: str, arguments: str, froms: int) -> None:
        words = [word for word in arguments.split() if not word.startswith("--")]
        name, _, tag = (words[0].split("@")[0].rsplit("/", 1)[-1] if words else "").partition(":")
        if froms > 1 or name != "python":
            raise ImageError(f"{shown}: a process sandbox runs one stage FROM a python image, in this Python "
                             f"({sys.version.split()[0]})")
        wanted = re.match(r"\d+\.\d+", tag)
        if wanted and wanted.group() != f"{sys.version_info.major}.{sys.version_info.minor}":
            logger.warning("%s: the env runs in this Python, %s", shown, sys.version.split()[0])

    def _run(self, shown: str, arguments: str) -> None:
        try:
            exec_form = json.loads(arguments) if arguments.startswith("[") else None
        except ValueError:
            exec_form = None
        commands = [exec_form] if isinstance(exec_form, list) else [
            shlex.split(part) for part in re.split(r"&&|;", arguments) if part.strip()]
        for words in commands:
            if words and posixpath.basename(words[0]) in ("useradd", "adduser", "groupadd", "addgroup"):
                continue
            pip = _pip_install_arguments(words)
            if pip is None:
                raise ImageError(f"{shown}: a process sandbox runs only `pip install` (and useradd) in a RUN; run "
                                 "this env on Docker (--sandbox local) or a cloud sandbox (--sandbox modal)")
            self._pip(shown, pip)

    def _pip(self, shown: str, arguments: list[str]) -> None:
        words = iter(arguments)
        for word in words:
            if word in ("-r", "--requirement"):
                self.pip_files.append((shown, posixpath.join(self.workdir, next(words, ""))))
            elif word.startswith(("--requirement=", "-r")):
                self.pip_files.append((shown, posixpath.join(self.workdir, word.split("=", 1)[-1].removeprefix("-r"))))
            elif word in _PIP_VALUE_OPTIONS:
                next(words, None)
            elif not word.startswith("-"):
                self.requirements.append((shown, _requirement(shown, word)))

    def _env(self, shown: str, arguments: str) -> None:
        words = shlex.split(arguments)
        if words and "=" not in words[0]:
            self.env[words[0]] = arguments.split(None, 1)[1] if len(words) > 1 else ""
            return
        for word in words:
            name, _, value = word.partition("=")
            self.env[name] = value

    def _cmd(self, shown: str, arguments: str, workdir: str) -> None:
        try:
            words = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
        except ValueError:
            words = []
        if len(words) < 2 or not _PYTHON.fullmatch(posixpath.basename(words[0])) or not words[1].endswith(".py"):
            raise ImageError(f"{shown}: a process sandbox runs CMD [\"python\", \"server.py\"], a Python script")
        self.script = self._in_app(shown, posixpath.join(workdir, words[1]))
        if not self.script.is_file():
            raise ImageError(f"{shown}: no COPY puts {words[1]} in {self.workdir}")
        self.args = tuple(words[2:])

    def _copy(self, shown: str, args, workdir: str) -> None:
        destination = posixpath.join(workdir, args.destination)
        sources = [match for source in args.sources
                   for match in sorted(glob.glob(source.lstrip("/") or ".", root_dir=self.context)) or [None]]
        if None in sources:
            raise ImageError(f"{shown}: the build context has no {args.sources}")
        into = (args.destination.endswith(("/", "/.")) or args.destination == "." or len(sources) > 1
                or self._in_app(shown, destination).is_dir())
        for source in sources:
            path = self.context / source
            if path.is_dir():
                shutil.copytree(path, self._in_app(shown, destination), dirs_exist_ok=True)
                continue
            target = self._in_app(shown, posixpath.join(destination, path.name) if into else destination)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)

    def _in_app(self, shown: str, container_path: str) -> Path:
        """The app folder's path for a path in the image, which must be under the final WORKDIR, the process's cwd."""
        relative = posixpath.relpath(posixpath.normpath(container_path), self.workdir)
        if relative == ".." or relative.startswith("../"):
            raise ImageError(f"{shown}: {container_path} is outside WORKDIR {self.workdir}; a process sandbox runs "
                             "the env in one folder, its WORKDIR, so COPY everything into it")
        return self.app / relative


def _pip_install_arguments(words: list[str]) -> list[str] | None:
    """The arguments after ``pip install`` (``pip3``, ``python -m pip``), or None for any other command."""
    if len(words) >= 3 and _PYTHON.fullmatch(posixpath.basename(words[0])) and words[1:3] == ["-m", "pip"]:
        words = ["pip", *words[3:]]
    if len(words) >= 2 and posixpath.basename(words[0]) in ("pip", "pip3") and words[1] == "install":
        return words[2:]
    return None


def _requirement(shown: str, text: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        raise ImageError(f"{shown}: {text!r} isn't a requirement a process sandbox can check ({e}); name packages "
                         "by requirement, as in requirements.txt") from None


def _requirements_file(shown: str, path: Path) -> list[tuple[str, Requirement]]:
    if not path.is_file():
        raise ImageError(f"{shown}: {path.name} isn't COPYed into the image before this RUN")
    found = []
    for number, line in enumerate(path.read_text("utf8").splitlines(), 1):
        text = line.split(" #", 1)[0].strip()
        where = f"{path.name} line {number}"
        if text.startswith(("-r ", "--requirement")):
            found += _requirements_file(shown, path.parent / text.split(None, 1)[-1].split("=", 1)[-1])
        elif text and not text.startswith(("#", "-")):
            found.append((where, _requirement(where, text)))
    return found


def _require(where: str, requirements: list[tuple[str, Requirement]], pip_install: bool) -> None:
    """Refuse, or with ``pip_install`` install, each requirement this Python lacks; log each installed at a version
    outside its range."""
    missing = []
    for source, requirement in requirements:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            missing.append((source, requirement))
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            logger.warning("%s: %s asks for %s, and this Python has %s, which the env runs with", where, source,
                           requirement, installed)
    if not missing:
        return
    command = [sys.executable, "-m", "pip", "install", *(str(requirement) for _, requirement in missing)]
    if pip_install:
        logger.info("%s: installing %s", where, " ".join(command[4:]))
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageError(f"{where}: `{shlex.join(command)}` failed: {(done.stdout + done.stderr)[-1500:]}")
        return
    listed = "; ".join(f"{requirement} ({source})" for source, requirement in missing)
    raise ImageError(f"{where} needs packages this Python doesn't have: {listed}. The env runs in this Python, so "
                     f"install them into it: {shlex.join(command)}; or set AGENTENV_NB_PIP_INSTALL=1 to have the "
                     "process sandbox install them")


def _outside_imports(app: Path) -> tuple[str, ...]:
    """The top-level modules the app's Python files import that aren't its own, so a parent can import them once."""
    local = {path.stem for path in app.glob("*.py")} | {path.name for path in app.iterdir() if path.is_dir()}
    found: set[str] = set()
    for path in app.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text("utf8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return tuple(sorted(found - local - {"__future__"}))
