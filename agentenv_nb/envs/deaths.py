"""Env processes that died under an episode, told to its client: ``guard`` starts a list for each ``/ws`` connection
(``watch``), the process sandbox reports to it the death of any env the connection's episode deployed (``report``),
and the guard adds what was reported to the error the client gets next, so "ReadError" says which env died and how.
The list rides a context variable, which the tasks the connection's handler starts inherit."""

from __future__ import annotations

import contextvars
import json
import logging

logger = logging.getLogger(__name__)
_reports: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("agentenv_nb_deaths", default=None)


def watch() -> list[str]:
    """Start a list of deaths for the episodes of this task (and the tasks it starts)."""
    reports: list[str] = []
    _reports.set(reports)
    return reports


def listener() -> list[str] | None:
    """The list the current episode reports to, if a connection watches it."""
    return _reports.get()


def report(reports: list[str] | None, message: str) -> None:
    """Log a death, and tell it to the episode that ``reports`` belongs to."""
    logger.warning("%s", message)
    if reports is not None:
        reports.append(message)


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
