"""The set-up step: read this host, say what fits it in one line, and install that set where it isn't yet; seconds
when it is. The same from a notebook's set-up cell and from a shell:

    python -m agentenv_nb.host              # read, decide, install
    python -m agentenv_nb.host --dry-run    # read, decide, and say what it would run
    python -m agentenv_nb.host --stack cuda12   # another known set, refused where this driver can't run it
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from agentenv_nb.host.plan import Plan, plan_for, plan_here, runs_on_driver, with_stack
from agentenv_nb.host.probe import installed, version_text
from agentenv_nb.host.stacks import STACKS, missing
from agentenv_nb.settings import SettingError

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
    """Why ``plan``'s set must not be installed here: a torch its driver can't run would leave no GPU."""
    stack, host = plan.stack, plan.host
    if stack is None or not host.gpus or runs_on_driver(stack.cuda, host.driver_cuda):
        return None
    fitting = plan_for(host)
    instead = (f"Run the set-up without --stack; it picks '{fitting.stack.name}' here" if fitting.stack else
               fitting.fix)
    return (f"agentenv_nb: the '{stack.name}' set's torch is a CUDA {version_text(stack.cuda)} build, and this driver "
            f"({host.driver}) runs CUDA {version_text(host.driver_cuda)} at most: installed, it would leave no GPU. "
            f"{instead}")


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
    print(f"agentenv_nb: installing the '{plan.stack.name}' set, about {plan.stack.minutes} minutes"
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
