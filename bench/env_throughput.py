"""Env throughput over the OpenEnv WebSocket: the kit's ``process`` sandbox against plain process-per-episode and the
framework's floor, at 1, 8 and 32 concurrent sessions, in one run.

    python bench/env_throughput.py                   # prints a markdown table
    python bench/env_throughput.py --write-results   # and appends its rows to bench/results/env_throughput.csv

Each path is a server of its own (``agentenv_nb.envs.serve.processes.serve_in_processes``:
``build_app(bundle, sandbox="process")`` under uvicorn, in a subprocess) serving one bundle written from the framework's
echo-mcp example:

- ``kit``: the echo task (deploy_env, deploy_agent, prompt_agent, env_outcome_verifier) with the warm pool on;
- ``plain``: the same task with ``AGENTENV_NB_ENV_POOL=0``, a fresh interpreter started per episode;
- ``floor``: a task of the same shape that deploys no env (deploy_agent, prompt_agent, a response verifier).

With ``--server-processes N`` (N > 1) the kit and plain paths are served from N processes each, sessions taking
them in turn, as ``AgentEnv.local(..., processes=N)`` serves; ``floor`` stays the framework's one process, and
``floorxN`` serves the floor's task from N processes too, the per-core comparison.

A session holds one WebSocket and plays episodes back to back: reset, call ``echo`` (the kit and plain paths),
``end_turn``. Reset is the time from sending the reset to its observation; an episode from the reset to the scored
``end_turn``; episodes/s is all sessions' episodes over the wall time. Paths take turns at each concurrency, so a
load that comes and goes on the machine falls on all three.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import websockets

from agentenv_nb.client.session import ws_url

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "env_throughput.csv"  # every run's rows; docs/benchmarks.md quotes the latest
PATHS = {"kit": ("echo", None), "plain": ("echo", "0"), "floor": ("floor", None)}  # task, AGENTENV_NB_ENV_POOL
TEXT = "hello from agent-env"  # what the example's verifier sends through the echo tool
ECHO_TASK = [
    {"id": "env", "type": "deploy_env", "env_id": "echo"},
    {"id": "agent", "type": "deploy_agent", "agent_name": "player", "env_ids": ["echo"]},
    {"id": "turn", "type": "prompt_agent", "agent_name": "player", "prompt": f"Echo {TEXT!r}.",
     "poll_interval_seconds": 0.1},
    {"id": "echoes", "type": "env_outcome_verifier", "env_id": "echo", "file_artifact_id": "check_echo",
     "verifier_id": "echoes"},
]
FLOOR_TASK = [
    {"id": "agent", "type": "deploy_agent", "agent_name": "player", "env_ids": []},
    {"id": "turn", "type": "prompt_agent", "agent_name": "player", "prompt": "Say done.", "prompt_id": "turn",
     "poll_interval_seconds": 0.1},
    {"id": "said", "type": "agent_prompt_response_verifier", "prompt_id": "turn", "verifier_id": "said",
     "criteria": [{"type": "response_contains", "needles": ["done"]}]},
]


def write_bundle(root: Path) -> Path:
    """The framework's echo-mcp example, its env deployed as one server, with the echo and floor tasks."""
    import agent_env

    shutil.copytree(Path(agent_env.__file__).parent / "examples" / "echo-mcp", root,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "envs" / "echo" / "env.toml").write_text('env_provider_type = "server"\n')
    (root / "tasks" / "smoke.json").unlink()
    (root / "tasks" / "echo.json").write_text(json.dumps(ECHO_TASK))
    (root / "tasks" / "floor.json").write_text(json.dumps(FLOOR_TASK))
    return root


def serve_path(name: str, bundle: Path, work: Path, capacity: int, pool: str | None, processes: int = 1):
    """A path's servers (``agentenv_nb.envs.serve.processes.serve_in_processes``), sharing a working folder and a
    framework store (XDG_STATE_HOME) of the path's own."""
    from agentenv_nb.envs.serve.processes import serve_in_processes

    # A store of its own, as a fresh machine has: the shared one's history slows every episode (see the docs).
    env = {**os.environ, "AGENTENV_NB_WORK_DIR": str(work / f"{name}-envs"), "XDG_STATE_HOME": str(work / name)}
    if pool is not None:
        env["AGENTENV_NB_ENV_POOL"] = pool
    return serve_in_processes(bundle, processes, sandbox="process", max_concurrent_envs=capacity, env=env,
                              start_timeout=300)


async def session(url: str, token: str, index: int, episodes: int, echo: bool, results: list) -> None:
    """Play ``episodes`` episodes of task ``index`` on one WebSocket, appending (reset s, episode s, reward)."""
    async with websockets.connect(ws_url(url), max_size=None, open_timeout=60,
                                  additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        for _ in range(episodes):
            started = time.perf_counter()
            opened = await exchange(ws, {"type": "reset", "data": {"split": "all", "index": index}})
            reset_s = time.perf_counter() - started
            if opened["data"]["done"]:
                raise RuntimeError(f"reset failed: {opened['data']['observation']['metadata']}")
            if echo:
                await exchange(ws, step("echo", text=TEXT))
            ended = await exchange(ws, step("end_turn", response="done"))
            results.append((reset_s, time.perf_counter() - started, ended["data"]["reward"]))


def step(tool: str, **arguments) -> dict:
    return {"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments}}


async def exchange(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await ws.recv())


async def measure(servers, index: int, echo: bool, sessions: int, episodes: int) -> dict:
    results: list = []
    started = time.perf_counter()
    urls = servers.urls
    await asyncio.gather(*(session(urls[i % len(urls)], servers.token, index, episodes, echo, results)
                           for i in range(sessions)))
    wall = time.perf_counter() - started
    resets = sorted(r for r, _, _ in results)
    return {"reset_p50": statistics.median(resets), "reset_p95": resets[min(len(resets) - 1, int(0.95 * len(resets)))],
            "episode_p50": statistics.median(e for _, e, _ in results), "eps": len(results) / wall,
            "scored": sum(reward == 1.0 for _, _, reward in results) / len(results), "n": len(results)}


def table(rows: dict) -> str:
    lines = ["| sessions | path | reset p50 (s) | reset p95 (s) | episode p50 (s) | episodes/s | scored 1.0 | "
             "episodes |", "|---|---|---|---|---|---|---|---|"]
    for (sessions, path), row in rows.items():
        lines.append(f"| {sessions} | {path} | {row['reset_p50']:.3f} | {row['reset_p95']:.3f} | "
                     f"{row['episode_p50']:.3f} | {row['eps']:.2f} | {row['scored']:.0%} | {row['n']} |")
    wide = next((path for _, path in rows if path.startswith("floorx")), None)  # the floor from N processes
    lines += ["", "| sessions | kit reset p50 / floor | plain reset p50 / kit | kit episodes/s / floor |"
              + (f" kit reset p50 / {wide} |" if wide else ""), "|---|---|---|---|" + ("---|" if wide else "")]
    for sessions in sorted({s for s, _ in rows}):
        kit, plain, floor = (rows[(sessions, path)] for path in ("kit", "plain", "floor"))
        lines.append(f"| {sessions} | {kit['reset_p50'] / floor['reset_p50']:.2f}x | "
                     f"{plain['reset_p50'] / kit['reset_p50']:.1f}x | {kit['eps'] / floor['eps']:.2f}x |"
                     + (f" {kit['reset_p50'] / rows[(sessions, wide)]['reset_p50']:.2f}x |" if wide else ""))
    return "\n".join(lines)


def write_results(rows: dict, options: str, load: float) -> None:
    """Append the run's rows to RESULTS (bench/results/env_throughput.csv), a row a concurrency and path, dated."""
    fields = ["date", "machine", "options", "load_after", "sessions", "path", "reset_p50_s", "reset_p95_s",
              "episode_p50_s", "episodes_per_s", "scored_1_pct", "episodes"]
    new = not RESULTS.exists()
    with RESULTS.open("a", newline="") as out:
        writer = csv.writer(out)
        if new:
            writer.writerow(fields)
        for (sessions, path), row in rows.items():
            writer.writerow([f"{datetime.now(timezone.utc):%Y-%m-%d}", f"{os.cpu_count()} cores", options,
                             f"{load:.1f}", sessions, path, f"{row['reset_p50']:.3f}", f"{row['reset_p95']:.3f}",
                             f"{row['episode_p50']:.3f}", f"{row['eps']:.2f}", round(100 * row["scored"]), row["n"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes", type=int, default=64, help="episodes per path and concurrency (at least one a "
                                                                 "session)")
    parser.add_argument("--server-processes", type=int, default=1,
                        help="serve the kit and plain paths (and a floorxN path) from this many processes each")
    parser.add_argument("--write-results", action="store_true", help=f"append the rows to {RESULTS}")
    args = parser.parse_args()
    command = " ".join(["python", "bench/env_throughput.py", *sys.argv[1:]])
    work = Path(tempfile.mkdtemp(prefix="env-throughput-"))
    bundle = write_bundle(work / "bundle")
    capacity = max(args.sessions)
    paths = {name: (pool, 1 if name == "floor" else args.server_processes) for name, (_, pool) in PATHS.items()}
    if args.server_processes > 1:
        paths[f"floorx{args.server_processes}"] = (None, args.server_processes)
    servers, rows = {}, {}
    try:
        for name, (pool, n) in paths.items():
            servers[name] = serve_path(name, bundle, work, capacity, pool, n)
        for name, server in servers.items():  # each path's first episode: the server's and the pool's start-up
            asyncio.run(measure(server, index_of(name), not name.startswith("floor"), 1, 1))
        for sessions in args.sessions:
            for name, server in servers.items():
                episodes = max(1, args.episodes // sessions)
                rows[(sessions, name)] = asyncio.run(
                    measure(server, index_of(name), not name.startswith("floor"), sessions, episodes))
                print(f"{sessions} sessions, {name}: {rows[(sessions, name)]}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(work, ignore_errors=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    pool = os.environ.get("AGENTENV_NB_ENV_POOL", "8")
    block = (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, load average {load} after "
             f"the run, kit pool {pool}, kit and plain from {args.server_processes} server process(es), a "
             f"fresh framework store per path. One run; medians and ratios are its own.\n\n{table(rows)}")
    print(f"### `{command}`\n\n{block}")
    if args.write_results:
        write_results(rows, " ".join(arg for arg in sys.argv[1:] if arg != "--write-results"), os.getloadavg()[0])


def index_of(path: str) -> int:
    """The path's task's index in the split ``all``, whose tasks are in name order: echo, floor."""
    return 0 if path in ("kit", "plain") else 1


if __name__ == "__main__":
    main()
