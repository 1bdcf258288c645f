"""How a line to the user names a run's parameter: as notebook 03 sets it (``WARM_START='x'``) or as the training
command takes it (``--warm-start 'x'``). A check that finds a problem says it once, in its caller's words.

    warm_start_problem("runs/desk", "")                   # "... or set WARM_START to a model folder or Hub id"
    warm_start_problem("runs/desk", "", naming=COMMAND)   # "... or pass --warm-start a model folder or Hub id"
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Naming:
    """The words for a parameter (``warm_start``) in a notebook or (``command``) on a command line."""

    command: bool = False

    def name(self, parameter: str) -> str:
        return f"--{parameter.replace('_', '-')}" if self.command else parameter.upper()

    def given(self, parameter: str, value: str) -> str:
        """The parameter with ``value`` (as it is to be shown): ``WARM_START='x'``, ``--warm-start 'x'``."""
        return f"{self.name(parameter)}{' ' if self.command else '='}{value}"

    def set_to(self, parameter: str) -> str:
        """What giving it a value is called: ``set WARM_START to``, ``pass --warm-start``."""
        return f"pass {self.name(parameter)}" if self.command else f"set {self.name(parameter)} to"

    def unset(self, parameter: str) -> str:
        """What leaving it at its empty default is called: ``leave PUSH_TO_HUB empty``, ``leave --push-to-hub out``."""
        return f"leave {self.name(parameter)} {'out' if self.command else 'empty'}"


NOTEBOOK, COMMAND = Naming(), Naming(command=True)
