"""A Dockerfile read as a local process's recipe: a plain-Python MCP server's image, ``FROM python``, its COPYs
laid out in one folder, its ``pip install`` requirements checked against this Python. Only a Dockerfile of ``RUNS``
reads so; any other line is refused by number, with what to do. With ``pip_install`` (AGENTENV_NB_PIP_INSTALL=1) a
missing requirement pinned by name and version (``name==1.2.3``; no URL, file or VCS) is installed from wheels, logged
at WARNING, not refused; an installed version outside a requirement's range is only logged,
since replacing it would change the server's own packages too. The server checks each env so when it starts
(``dockerfile_problem``), and again when it deploys one (``image.read_image``), with the same code."""

from __future__ import annotations

import contextlib
import functools
import glob
import io
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
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from agent_env.utils.docker.dockerfile import Instruction, copy_arguments
from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import image_from
from dockerfile_parse.util import get_key_val_dictionary
from packaging.requirements import InvalidRequirement, Requirement

logger = logging.getLogger(__name__)

RUNS = ('FROM python…, WORKDIR, COPY, RUN pip install … (or useradd), ENV, USER, EXPOSE, LABEL and '
        'CMD ["python", "server.py"]')
_NO_OPS = {"USER", "EXPOSE", "LABEL", "COMMENT"}  # COMMENT: how dockerfile-parse lists a comment line
_ELSEWHERE = "run this env on Docker (--sandbox local) or a cloud sandbox (--sandbox modal)"
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-f", "--find-links",
                      "--target", "-t", "--prefix", "--root", "--trusted-host", "--platform", "--python-version"}


class ImageError(ValueError):
    """An env image a local process can't run; the message says which line and what to do."""




def read_dockerfile(where: str, context: Path, app: Path, dockerfile: str = "Dockerfile",
                    pip_install: bool | None = None) -> Dockerfile:
    """Read the Dockerfile ``dockerfile`` of the build context ``context``, laying its COPYs out in ``app``; with
    ``pip_install`` given, also refuse (False) or install (True) each requirement this Python lacks. Raises ImageError
    naming the line, or the packages and the command that installs them."""
    read = Dockerfile(where, context, app).read(_in_context(where, context, context / dockerfile).read_text("utf8"))
    if pip_install is not None:
        _require(where, read.requirements, pip_install)
    return read


def dockerfile_problem(env_folder: Path, pip_install: bool | None = None) -> str | None:
    """Why the env folder's Dockerfile can't run as a local process, or None when it can; with ``pip_install`` given,
    a requirement this Python lacks is a problem too (see ``read_dockerfile``)."""
    try:
        with tempfile.TemporaryDirectory() as scratch:  # the reader lays the image's files out in app/
            read_dockerfile(f"envs/{env_folder.name}/Dockerfile", env_folder, Path(scratch) / "app",
                            pip_install=pip_install)
    except (ImageError, OSError) as error:
        return str(error)
    return None


@dataclass
class Dockerfile:
    """One pass over a Dockerfile: it fills ``app`` with what its COPYs copy from ``context``."""

    where: str
    context: Path
    app: Path
    workdir: str = "/"
    env: dict = field(default_factory=dict)
    requirements: list = field(default_factory=list)  # (source, Requirement)
    later: list = field(default_factory=list)  # the COPYs and -r files: their paths map by the final WORKDIR
    script: Path | None = None
    args: tuple = ()

    def read(self, text: str) -> Dockerfile:
        froms, cmd = 0, None
        for line in DockerfileParser(fileobj=io.BytesIO(text.encode("utf8"))).structure:
            keyword, value = line["instruction"], line["value"]
            shown = f"{self.where} line {line['startline'] + 1}: {line['content'].strip()!r}"
            if keyword == "FROM":
                froms += 1
                name, _, tag = (image_from(value)[0] or "").split("@")[0].rsplit("/", 1)[-1].partition(":")
                if froms > 1 or name != "python":
                    raise ImageError(f"{shown}: a process sandbox runs one stage FROM a python image, in this Python "
                                     f"({sys.version.split()[0]})")
                # An env written for an older Python runs in a newer one (Colab's 3.12 runs GridSim's 3.11 image);
                # one written for a newer Python may use what this one lacks
                wanted = re.match(r"(\d+)\.(\d+)", tag)
                if wanted and tuple(map(int, wanted.groups())) > sys.version_info[:2]:
                    logger.warning("%s: the env runs in this older Python, %s", shown, sys.version.split()[0])
            elif keyword == "WORKDIR":
                self.workdir = posixpath.normpath(posixpath.join(self.workdir, value.strip()))
            elif keyword == "COPY":
                args = copy_arguments(Instruction(keyword, value, line["content"]))
                if args is None or args.heredoc or any(f.startswith("--from") for f in args.flags):
                    raise ImageError(f"{shown}: a process sandbox copies only files of the build context")
                self.later.append(functools.partial(self._copy, shown, args, self.workdir))
            elif keyword == "RUN":
                for words in _commands(shown, value):
                    self._run(shown, words)
            elif keyword == "ENV":
                try:  # this Python's environment stands for the base image's: the process inherits it
                    self.env.update(get_key_val_dictionary(value, env_replace=True, envs={**os.environ, **self.env}))
                except (ValueError, IndexError):
                    raise ImageError(f"{shown}: a process sandbox reads an ENV of name=value pairs") from None
            elif keyword == "CMD":
                cmd = (shown, _commands(shown, value), self.workdir)
            elif keyword not in _NO_OPS:
                raise ImageError(f"{shown}: a process sandbox runs only a Dockerfile of {RUNS}; {_ELSEWHERE}")
        if cmd is None:
            raise ImageError(f"{self.where} has no CMD; a process sandbox runs CMD [\"python\", \"server.py\"]")
        self.app.mkdir()
        for step in self.later:
            step()
        shown, commands, workdir = cmd
        words = commands[0] if len(commands) == 1 else []
        if len(words) < 2 or not _PYTHON.fullmatch(posixpath.basename(words[0])) or not words[1].endswith(".py"):
            raise ImageError(f"{shown}: a process sandbox runs CMD [\"python\", \"server.py\"], a Python script")
        self.script, self.args = self._in_app(shown, posixpath.join(workdir, words[1])), tuple(words[2:])
        if not self.script.is_file():
            raise ImageError(f"{shown}: no COPY puts {words[1]} in {self.workdir}")
        return self

    def _run(self, shown: str, words: list[str]) -> None:
        """One command of a RUN: a ``pip install``, whose requirements it notes, or a user's or group's creation."""
        if posixpath.basename(words[0]) in ("useradd", "adduser", "groupadd", "addgroup"):
            return
        if len(words) >= 3 and _PYTHON.fullmatch(posixpath.basename(words[0])) and words[1:3] == ["-m", "pip"]:
            words = ["pip", *words[3:]]
        if len(words) < 2 or posixpath.basename(words[0]) not in ("pip", "pip3") or words[1] != "install":
            raise ImageError(f"{shown}: a process sandbox runs only `pip install` (and useradd) in a RUN; {_ELSEWHERE}")
        arguments = iter(words[2:])
        for word in arguments:
            if word in ("-r", "--requirement"):
                word = "--requirement=" + next(arguments, "")
            if word.startswith(("--requirement=", "-r")):
                path = posixpath.join(self.workdir, word.removeprefix("--requirement=").removeprefix("-r"))
                self.later.append(functools.partial(self._requirements_file, shown, path))
            elif word in _PIP_VALUE_OPTIONS:
                next(arguments, None)
            elif not word.startswith("-"):
                self.requirements.append((shown, _requirement(shown, word)))

    def _requirements_file(self, shown: str, path: str, folder: Path | None = None) -> None:
        """Note a requirements file's requirements: ``path`` in the image, or in ``folder`` for one it names."""
        file = folder / path if folder else self._in_app(shown, path)
        if not file.resolve().is_relative_to(self.app.resolve()):  # the app holds only what COPYs took from the context
            raise ImageError(f"{shown}: {path} is outside the image's WORKDIR {self.workdir}; a process sandbox reads "
                             "only requirements files COPYed into it")
        if not file.is_file():
            raise ImageError(f"{shown}: {file.name} isn't COPYed into the image before this RUN")
        for number, line in enumerate(file.read_text("utf8").splitlines(), 1):
            text, where = line.split(" #", 1)[0].strip(), f"{file.name} line {number}"
            if text.startswith(("-r ", "--requirement")):
                self._requirements_file(shown, text.split(None, 1)[-1].split("=", 1)[-1], file.parent)
            elif text and not text.startswith(("#", "-")):
                self.requirements.append((where, _requirement(where, text)))

    def _copy(self, shown: str, args, workdir: str) -> None:
        destination = posixpath.join(workdir, args.destination)
        found = [sorted(glob.glob(source.lstrip("/") or ".", root_dir=self.context)) for source in args.sources]
        if not all(found):
            raise ImageError(f"{shown}: the build context has no {args.sources}")
        sources = [_in_context(shown, self.context, self.context / match) for matches in found for match in matches]
        into = (args.destination.endswith(("/", "/.")) or args.destination == "." or len(sources) > 1
                or self._in_app(shown, destination).is_dir())

        def copy(source: str, target: str) -> None:  # each file a copied folder holds, its links followed
            shutil.copy2(_in_context(shown, self.context, Path(source)), target)

        for path in sources:
            if path.is_dir():
                shutil.copytree(path, self._in_app(shown, destination), copy_function=copy, dirs_exist_ok=True)
            else:
                target = self._in_app(shown, posixpath.join(destination, path.name) if into else destination)
                target.parent.mkdir(parents=True, exist_ok=True)
                copy(str(path), str(target))

    def _in_app(self, shown: str, container_path: str) -> Path:
        """The app folder's path for a path in the image, which must be under the final WORKDIR, the process's cwd."""
        relative = posixpath.relpath(posixpath.normpath(container_path), self.workdir)
        if relative == ".." or relative.startswith("../"):
            raise ImageError(f"{shown}: {container_path} is outside WORKDIR {self.workdir}; a process sandbox runs "
                             "the env in one folder, its WORKDIR, so COPY everything into it")
        return self.app / relative


def _in_context(shown: str, context: Path, path: Path) -> Path:
    """``path``, which must lie in the build context once ``..`` and links are followed: the sandbox reads and copies
    as the server's user, root included, so the context's bounds are all that keeps other files out."""
    if not path.resolve().is_relative_to(context.resolve()):
        raise ImageError(f"{shown}: {os.path.relpath(path, context)} is outside the build context, the env's folder; "
                         "a Docker build reads only files inside it, and so does a process sandbox")
    return path


def _commands(shown: str, value: str) -> list[list[str]]:
    """A RUN's or CMD's commands as lists of words: its exec form, or its shell form split at ``&&`` and ``;``."""
    if value.startswith("["):
        with contextlib.suppress(ValueError):
            if isinstance(words := json.loads(value), list) and words and all(isinstance(w, str) for w in words):
                return [words]
    lexer = shlex.shlex(value, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters, commands = True, "", [[]]
    try:
        for word in lexer:
            commands.append([]) if word in ("&&", ";") else commands[-1].append(word)
    except ValueError as e:  # an unclosed quote
        raise ImageError(f"{shown}: {e}") from None
    return [words for words in commands if words]


def _requirement(shown: str, text: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        # its first line only: the rest quotes the text, which may be any file's
        raise ImageError(f"{shown} isn't a requirement a process sandbox can check ({str(e).splitlines()[0]}); name "
                         "packages by requirement, as in requirements.txt") from None


def _require(where: str, requirements: list[tuple[str, Requirement]], pip_install: bool) -> None:
    """Refuse, or with ``pip_install`` install, each requirement this Python lacks; log one installed out of range."""
    missing = []
    for source, requirement in requirements:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            missing.append((source, requirement))
        else:
            if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
                logger.warning("%s: %s asks for %s; this Python has %s", where, source, requirement, installed)
    command = [sys.executable, "-m", "pip", "install", *(str(requirement) for _, requirement in missing)]
    if missing and not pip_install:
        listed = "; ".join(f"{requirement} ({source})" for source, requirement in missing)
        raise ImageError(f"{where} needs packages this Python doesn't have: {listed}. The env runs in this Python, so "
                         f"install them into it: {shlex.join(command)}; or set AGENTENV_NB_PIP_INSTALL=1 to have the "
                         "process sandbox install them")
    if unpinned := [f"{requirement} ({source})" for source, requirement in missing if not _pinned(requirement)]:
        raise ImageError(f"{where}: AGENTENV_NB_PIP_INSTALL installs only requirements pinned by name and version "
                         f"(name==1.2.3), from the package index; not {'; '.join(unpinned)}. Install them into this "
                         f"Python yourself if you trust them: {shlex.join(command)}")
    if missing:
        # Wheels only: an sdist would run its setup code at install, in the server's own environment.
        command[4:4] = ["--only-binary", ":all:"]
        logger.warning("%s: AGENTENV_NB_PIP_INSTALL is on, so the process sandbox installs into this Python "
                       "(the server's own): %s", where, shlex.join(command[4:]))
        if (done := subprocess.run(command, capture_output=True, text=True)).returncode != 0:
            raise ImageError(f"{where}: `{shlex.join(command)}` failed: {(done.stdout + done.stderr)[-1500:]}")


def _pinned(requirement: Requirement) -> bool:
    """Whether ``requirement`` names one version of a package of the index: ``name==1.2.3``, no URL, file or VCS."""
    specifiers = list(requirement.specifier)
    return (requirement.url is None and len(specifiers) == 1 and specifiers[0].operator == "=="
            and "*" not in specifiers[0].version)
