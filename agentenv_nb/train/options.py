"""A run's parameters (``train.run.Run``) as a command's options, in the run's groups ("Parameters that control ..."),
each with the run's default and help, and every mistake said in one line.

    options = Options(SFTRun, prog="python -m agentenv_nb.train sft", description="...")
    options.add("bundle")
    options.add("distill_steps", type=counting)
    args, run = options.parse(argv)
    check_settings()   # a bad AGENTENV_NB_* setting: UsageError, in one line
"""

from __future__ import annotations

import argparse
import json

from agentenv_nb import settings


class UsageError(Exception):
    """What the user asked for can't run; the message says what to change."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


class Options:
    """The parser of a command that runs ``run_class``'s steps, an argument group for each of its parameter groups."""

    def __init__(self, run_class: type, **parser_arguments):
        self.run_class = run_class
        self.parser = OneLineParser(**parser_arguments)
        groups = {words: self.parser.add_argument_group(f"Parameters that control {words}")
                  for words in run_class.groups()}
        self._groups = {name: groups[words] for words, names in run_class.groups().items() for name in names}

    def group(self, name: str):
        """The argument group that parameter ``name`` stands in: for options of the command's own beside it."""
        return self._groups[name]

    def add(self, name: str, **given) -> None:
        """``--name`` with the run's default and help for the parameter ``name``, unless ``given`` says otherwise."""
        default = given.pop("default", getattr(self.run_class(), name))
        text = given.pop("help", self.run_class.help(name)).replace("%", "%%")
        shown = f" (default: {default})" if default not in (None, "") else ""
        self._groups[name].add_argument(f"--{name.replace('_', '-')}", default=default, help=text + shown, **given)

    def parse(self, argv: list[str] | None = None):
        """The options ``argv`` gives, and the run they describe."""
        args = self.parser.parse_args(argv)
        return args, self.run_class(**{name: getattr(args, name) for name in self.run_class.command_options()})


def check_settings() -> None:
    """Every ``AGENTENV_NB_*`` setting read now, a bad one said in one line (``UsageError``): a command's every path
    reads them later, some only after Unsloth loads (seconds)."""
    try:
        settings.check_environment()
    except settings.SettingError as error:
        raise UsageError(str(error)) from None


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def counting(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 0")
    return int(text)


def setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
