"""What AgentEnv adds to a tool call, on loopback: the same GridSim tool called through an environment of
``env.factory`` (the method TRL calls) and through a raw WebSocket client, alternately, on one server.

    python bench/client_overhead.py --calls 300          # prints the markdown table docs/benchmarks.md shows

The server is ``AgentEnv.local`` on a tiny GridSim bundle written to a temporary folder, its env a process
(``sandbox="process"``); each client plays its own episode. Overhead = AgentEnv's p50 (p95) minus the raw
client's: the event-loop hop, the episode bookkeeping and the JSON handling around the same round trip.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from websockets.sync.client import connect

from agentenv_nb import AgentEnv
from agentenv_nb.tasks.gridsim import write_bundle
from agentenv_nb.client.session import ws_url

TOOL, ARGUMENTS = "get_prices", {}


@contextmanager
def raw_session(url: str, token: str, split: str, index: int):
    """A plain ``/ws`` client holding one episode: yields a function making one tool call."""
    with connect(ws_url(url), compression=None, max_size=None, proxy=None,
                 additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        def request(message: dict) -> dict:
            ws.send(json.dumps(message))
            return json.loads(ws.recv())

        request({"type": "reset", "data": {"split": split, "index": index}})
        call = {"type": "step", "data": {"type": "call_tool", "tool_name": TOOL, "arguments": ARGUMENTS}}
        yield lambda: request(call)


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """p50 and p95 in milliseconds."""
    cuts = statistics.quantiles(seconds, n=20)
    return statistics.median(seconds) * 1e3, cuts[18] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="tool calls per client (after 20 warm-up calls)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, AgentEnv.local(
            write_bundle(Path(folder) / "gridsim-bench", train=2, eval=1), sandbox="process") as env:
        play = env.factory()
        play.reset(**env.dataset[0])
        ours = getattr(play, TOOL)
        timings: dict[str, list[float]] = {"agentenv": [], "raw": []}
        with raw_session(env.url, env.token, env.split, 1) as raw:
            for i in range(args.calls + 20):
                for name, call in (("agentenv", lambda: ours(**ARGUMENTS)), ("raw", raw)):
                    start = time.perf_counter()
                    call()
                    if i >= 20:
                        timings[name].append(time.perf_counter() - start)
    (ours50, ours95), (raw50, raw95) = percentiles(timings["agentenv"]), percentiles(timings["raw"])
    print(f"| {TOOL} on loopback, {args.calls} calls each | p50 (ms) | p95 (ms) |\n|---|---|---|")
    print(f"| raw WebSocket client | {raw50:.2f} | {raw95:.2f} |")
    print(f"| AgentEnv tool method | {ours50:.2f} | {ours95:.2f} |")
    print(f"| overhead | {ours50 - raw50:.2f} | {ours95 - raw95:.2f} |")


if __name__ == "__main__":
    main()
