"""Env processes that died under an episode, told to its client: ``guard`` starts a watch for each ``/ws``
connection (``watch``), the process sandbox reports to it the death of any env the connection's episode deployed
(``report``), and the guard adds what was reported to the error the client gets next, so "ReadError" says which env
died and how, or ends a reset under way at once (``on_report``). The watch rides a context variable, which the tasks
the connection's handler starts inherit."""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass
class Watch:
    """The deaths reported to one connection's episodes, and what to call with each as it is reported, with the
    number of the reset whose episode deployed the env that died (``resets``: the connection's resets so far)."""

    reports: list[str] = field(default_factory=list)
    on_report: Callable[[str, int], None] | None = None
    resets: int = 0


_watches: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("agentenv_nb_deaths", default=None)


def watch(on_report: Callable[[str, int], None] | None = None) -> Watch:
    """Start a watch on the deaths under the episodes of this task (and the tasks it starts)."""
    started = Watch(on_report=on_report)
    _watches.set(started)
    return started


def listener() -> Watch | None:
    """The watch the current episode reports to, if a connection watches it."""
    return _watches.get()


def report(watching: Watch | None, message: str, reset: int = 0) -> None:
    """Log a death, and tell it to the connection that ``watching`` belongs to; ``reset``: the number of the reset
    whose episode deployed the env (``Watch.resets`` as the env's sandbox was made)."""
    logger.warning("%s", message)
    if watching is not None:
        watching.reports.append(message)
        if watching.on_report is not None:
            watching.on_report(message, reset)


def amended(text: str, reports: list[str]) -> str:
    """A frame ``text`` whose error messages say what ``reports`` holds; other frames as they are."""
    if not reports or '"error"' not in text:
        return text
    said = " (" + "; ".join(reports) + ")"
    try:
        frame = json.loads(text)
    except ValueError:
        return text

    def amend(value):
        if isinstance(value, dict):
            return {key: (item + said if key in ("error", "message") and isinstance(item, str) else amend(item))
                    for key, item in value.items()}
        return [amend(item) for item in value] if isinstance(value, list) else value

    return json.dumps(amend(frame))
