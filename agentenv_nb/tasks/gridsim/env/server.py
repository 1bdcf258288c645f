"""The GridSim env: one grid battery for one day of day-ahead prices, served as an MCP server.

The task loads its day (a JSON file ``{"day": ..., "prices": [24 numbers]}``) through the data plane, the
agent calls ``get_prices`` and ``submit_schedule``, and the task's verifier asks the ``grade`` extension, a
REST route the agent has no tool for. The rules and the score are ``battery.py``'s, shipped beside this file.

    MCP_PORT=18765 python server.py   # then a task's load_artifact step loads a day into it
"""

import base64
import json
import urllib.request
from typing import Annotated

from pydantic import Field

import battery
from agentenv_protocol import AgentEnvEnvironment, add_data, environment_card, extension, reset_data, tool

GRADE_URI = "urn:gridsim:grade/v1"


@environment_card(name="gridsim")
class GridSimEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        self.day: dict | None = None
        self.submitted: list[int] | None = None

    @reset_data
    def clear(self) -> None:
        self.day, self.submitted = None, None

    @add_data
    def load(self, parts: list) -> None:
        for part in parts:
            day = _read_part(part)
            if len(day["prices"]) != battery.HOURS:
                raise ValueError(f"a day has {battery.HOURS} hourly prices, this one {len(day['prices'])}")
            self.day, self.submitted = day, None

    @tool(name="get_prices")
    def get_prices(self) -> str:
        """The day's 24 hourly prices in $/MWh, hour 0 (midnight) first, as a JSON list."""
        return json.dumps(self._day()["prices"])

    @tool(name="submit_schedule")
    def submit_schedule(
        self,
        schedule: Annotated[list[int], Field(description="24 integers, one an hour from hour 0: 1 charges 1 MWh, "
                                                         "-1 sells 1 MWh, 0 idles.")],
    ) -> str:
        """Submit the battery's schedule for the day; a later submission replaces an earlier one."""
        prices = self._day()["prices"]
        profit, taken = battery.settle(prices, schedule)
        self.submitted = list(schedule)
        skipped = sum(1 for asked, done in zip(schedule, taken) if asked != done)
        note = f"; {skipped} action(s) the battery couldn't take (full or empty) did nothing" if skipped else ""
        return f"schedule accepted: profit ${profit:.2f}{note}"

    @extension(GRADE_URI, description="The grade of the submitted schedule, for the task's verifier.")
    def grade(self) -> dict:
        prices = self._day()["prices"]
        best, _ = battery.optimum(prices)
        if self.submitted is None:
            return {"score": 0.0, "profit": None, "optimum": best, "why": "no schedule was submitted"}
        profit, _ = battery.settle(prices, self.submitted)
        return {"score": battery.score(prices, self.submitted), "profit": profit, "optimum": best,
                "why": f"profit ${profit:.2f} of the day's best ${best:.2f}"}

    def _day(self) -> dict:
        if self.day is None:
            raise RuntimeError("no day is loaded: the task loads one before the agent's turn")
        return self.day


def _read_part(part) -> dict:
    """A day from a data-plane part: a file (by file:// or http(s) URI, or inline bytes) or a JSON data part."""
    if getattr(part, "kind", None) == "data":
        return dict(part.data)
    file = part.file
    if getattr(file, "bytes", None):
        return json.loads(base64.b64decode(file.bytes))
    if file.uri.startswith("file://"):
        with open(file.uri.removeprefix("file://"), encoding="utf-8") as handle:
            return json.load(handle)
    with urllib.request.urlopen(file.uri, timeout=30) as response:
        return json.load(response)


if __name__ == "__main__":
    GridSimEnv().serve()
