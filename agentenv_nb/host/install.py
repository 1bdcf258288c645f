"""The set-up step: read this host, say what fits it in one line, and install that set where it isn't yet; seconds
when it is. The same from a notebook's set-up cell and from a shell:

    python -m agentenv_nb.host              # read, decide, install
    python -m agentenv_nb.host --dry-run    # read, decide, and say what it would run
    python -m agentenv_nb.host --stack cuda12   # another known set, refused where this driver can't run it
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from agentenv_nb.host.plan import Plan, plan_for, plan_here, runs_on_driver, with_stack
from agentenv_nb.host.probe import installed, version_text
from agentenv_nb.host.stacks import STACKS, for_runtime_torch, missing
from agentenv_nb.settings import SettingError

GB_A_MINUTE = 1e9  # a notebook host's set-up: bytes downloaded and unpacked a minute
RESTART = "restart the runtime (Colab: Runtime -> Restart session), then run the notebook from the top"


def commands(plan: Plan, python: str = sys.executable) -> list[list[str]]:
    """The pip commands that install ``plan``'s set over what is here: [] when it is installed."""
    stack, keep = plan.stack, plan.keep_torch
    todo = missing(stack, keep)
    if not todo:
        return []
    pip = [python, "-m", "pip"]
    pins = [pin for pin in todo if not pin.startswith("-")]
    torch = [pin for pin in pins if pin.startswith("torch==")]
    run = []
    if stack.torch_index and torch:
        run.append([*pip, "install", "-q", *torch, "--index-url", stack.torch_index])
        pins = [pin for pin in pins if pin not in torch]
    if pins:
        held = [f"torch=={keep}"] if keep else []  # nothing the set installs may replace the runtime's torch
        run.append([*pip, "install", "-q", *dict.fromkeys(held + pins)])
    removed = [pin[1:] for pin in todo if pin.startswith("-")]
    if removed:
        run.append([*pip, "uninstall", "-y", "-q", *removed])
    return run


def refusal(plan: Plan) -> str | None:
    """Why ``plan``'s set must not be installed here: a torch its driver can't run would leave no GPU; a vLLM built for
    another torch than the runtime's, which the set keeps, can't be installed beside it."""
    stack, host = plan.stack, plan.host
    if stack is None:
        return None
    fitting = plan_for(host)
    instead = (f"Run the set-up without --stack; it picks '{fitting.stack.name}' here" if fitting.stack else
               fitting.fix)
    if stack.keeps_torch and for_runtime_torch(host.torch, host.torch_cuda) is not stack:
        return (f"agentenv_nb: the '{stack.name}' set keeps the runtime's torch {stack.keeps_torch} (a CUDA "
                f"{version_text(stack.cuda)} build) and adds the vLLM built for it; this runtime has "
                f"{f'torch {host.torch}' if host.torch else 'no torch'}. {instead}")
    if not host.gpus or runs_on_driver(stack.cuda, host.driver_cuda):
        return None
    return (f"agentenv_nb: the '{stack.name}' set's torch is a CUDA {version_text(stack.cuda)} build, and this driver "
            f"({host.driver}) runs CUDA {version_text(host.driver_cuda)} at most: installed, it would leave no GPU. "
            f"{instead}")


def downloads(report: dict) -> list[str]:
    """The files an install downloads, from pip's report of it (``--dry-run --report``): their URLs."""
    return [item["download_info"]["url"] for item in report["install"]
            if item["download_info"]["url"].startswith(("https://", "http://"))]


def content_length(url: str) -> int | None:
    """A file's size as its index says it (Content-Length), or None where the index can't be asked."""
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as response:
            return int(response.headers["Content-Length"])
    except (OSError, ValueError, TypeError):
        return None


def download_bytes(run: list[list[str]]) -> int | None:
    """What ``run``'s installs download, in bytes: pip's resolver says which files (a dry run), their index how large
    each is; None where either can't be had (no network), and the set's ``minutes`` is said instead."""
    reports = []
    for command in run:
        if command[3] != "install":
            continue
        try:  # one try, soon given up: with no network pip would otherwise retry for minutes
            done = subprocess.run([*command, "--dry-run", "--report", "-", "--retries", "0", "--timeout", "15"],
                                  capture_output=True, text=True, timeout=300, check=True)
            reports.append(json.loads(done.stdout))
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    return reports_bytes(reports, content_length)


def reports_bytes(reports: list[dict], size_of) -> int | None:
    """The bytes pip's ``reports`` download, each file's size ``size_of(url)`` (asked at once); None if one is
    unknown."""
    from concurrent.futures import ThreadPoolExecutor

    urls = [url for report in reports for url in downloads(report)]
    with ThreadPoolExecutor(16) as pool:
        sizes = list(pool.map(size_of, urls))
    return None if None in sizes else sum(sizes)


def how_long(size: int | None, minutes: int) -> str:
    """The set-up's time in words, from its download's size (about a GB a minute, fetched and unpacked, plus pip's
    resolving), or the set's own ``minutes`` where the size isn't known."""
    if size is not None:
        minutes = round(0.5 + size / GB_A_MINUTE)
    said = "about a minute" if minutes <= 1 else "a few minutes" if minutes <= 5 else f"about {minutes} minutes"
    return f"about {size / 1e9:.1f} GB, {said}" if size is not None else said


def set_up(plan: Plan, dry_run: bool = False, python: str = sys.executable) -> int:
    """Say ``plan`` and install its set; 0 when done (or nothing to do), 1 when nothing fits or pip failed."""
    print(plan.line(), flush=True)
    if plan.stack is None:
        return 1
    if problem := refusal(plan):
        print(problem, flush=True)
        return 1
    run = commands(plan, python)
    if not run:
        print(f"agentenv_nb: the '{plan.stack.name}' set is installed; nothing to do", flush=True)
        return 0
    if not plan.stack.ran:
        print(f"agentenv_nb: the '{plan.stack.name}' set is decided for this host but was not run by the kit's "
              "own tests (docs/hosts.md)", flush=True)
    before = {name: installed(name) for name in ("torch", "numpy", "transformers")}
    print(f"agentenv_nb: installing the '{plan.stack.name}' set: {how_long(download_bytes(run), plan.stack.minutes)}"
          + (": " + "; ".join(" ".join(command[1:]) for command in run) if dry_run else ""), flush=True)
    if dry_run:
        return 0
    while run:  # what the installs pull in again (unsloth requires xformers) is removed after them
        for command in run:
            if (code := subprocess.run(command).returncode) != 0:
                print(f"agentenv_nb: `{' '.join(command[1:4])} ...` failed (exit {code}); pip's lines above say why. "
                      "Run this step again once that is fixed: it installs only what is missing", flush=True)
                return 1
        run = [command for command in commands(plan, python) if command[3] == "uninstall"]
    replaced = [f"{name} {was} -> {installed(name)}" for name, was in before.items() if was and installed(name) != was]
    print("agentenv_nb: installed; " + (f"{', '.join(replaced)}: {RESTART}" if replaced else "ready"), flush=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_nb.host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="say what would be installed, install nothing")
    parser.add_argument("--stack", choices=sorted(STACKS), help="install this known set instead of the host's")
    args = parser.parse_args(argv)
    try:
        plan = plan_here()
    except SettingError as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    if args.stack:
        plan = with_stack(plan, STACKS[args.stack], f"--stack {args.stack} names it")
    sys.exit(set_up(plan, args.dry_run))
