"""A played task as a person reads it, and "try it": play any day (or your own words for it) with a model.

    rollout = try_it(model, tokenizer, env, day=3)                     # eval day 3, greedy
    rollout = try_it(model, tokenizer, env, day=3, prompt="Plan today's battery: charge cheap, sell dear.")
    transcript(rollout)                                               # who said what; tool calls as calls
    best_and_worst("runs/demo/grpo", step=12)                         # that step's best and worst rollout, as logged

The env still plays the day (its tools answer with that day's data) and its verifier scores what the model did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from agentenv_nb.client.metrics import ROLLOUTS
from agentenv_nb.stops import Stop
from agentenv_nb.tables import text_table
from agentenv_nb.train.rollout import Rollout, play

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


def task_name(task_id: str) -> str:
    """A task's name without the folder its bundle was served from: "gridsim-tiny/eval-0000"."""
    return "/".join(task_id.split("/")[-2:])


def _call(call: dict) -> str:
    arguments = call["function"].get("arguments") or {}
    if isinstance(arguments, str):
        return f"{call['function']['name']}({arguments})"
    return f"{call['function']['name']}(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items()) + ")"


def transcript(rollout: Rollout, limit: int = 1200) -> Styler:
    """A table a person reads, a row a message: who (system, user, assistant, or the tool that answered) and what,
    tool calls written as calls, text wrapped between words and cut at ``limit`` characters; its caption the task and
    the verifier's score, or, for a demonstration of a file (no task id), that it wasn't played."""
    import pandas as pd

    def text(message):
        whole = "\n".join(part for part in [(message.get("content") or "").strip(),
                                            *map(_call, message.get("tool_calls") or [])] if part)
        return whole if len(whole) <= limit else whole[:limit - 1] + "…"

    who = [f"tool: {m['name']}" if m["role"] == "tool" and m.get("name") else m["role"] for m in rollout["messages"]]
    table = pd.DataFrame({"who": who, "message": [text(m) for m in rollout["messages"]]})
    score = rollout["reward"]
    if not rollout["task_id"]:  # a demonstration from a file (DEMOS): no task was played, so nothing scored it
        return text_table(table, caption="a demonstration, as given: not played here, so not scored")
    said = f"reward {score:.2f}" if score is not None else "not scored (the episode ended without a score)"
    return text_table(table, caption=f"{task_name(rollout['task_id'])}: {said}")


def logged_rollouts(output_dir: str | Path, step: int | None = None) -> tuple[int, list[Rollout]]:
    """The training rollouts a run logged at ``step`` (default: its last logged step), as transcripts: the step and
    its rollouts. ``ScoreLog`` writes them to ``<output_dir>/rollouts/step-<N>.jsonl`` as the trainer logs."""
    folder = Path(output_dir) / ROLLOUTS
    files = {int(path.stem.removeprefix("step-")): path for path in folder.glob("step-*.jsonl")}
    if not files:
        raise Stop(f"no rollouts logged in {folder}: train first (the Train cell), with env.metrics among the "
                   f"trainer's callbacks")
    step = max(files) if step is None else step
    if step not in files:
        raise Stop(f"no rollouts logged at step {step}; the steps logged: {', '.join(map(str, sorted(files)))}")
    rollouts = []
    for line in files[step].read_text(encoding="utf-8").splitlines():
        logged = json.loads(line)
        calls = [m for m in logged["messages"] if m["role"] == "tool"]
        rollouts.append(Rollout(task_id=logged["task_id"], messages=logged["messages"], tools=[],
                                reward=logged["reward"], tool_calls=len(calls),
                                tool_failures=sum(str(m["content"]).startswith("error: ") for m in calls)))
    return step, rollouts


def best_and_worst(output_dir: str | Path, step: int | None = None) -> list[Styler]:
    """The best and the worst scored rollout of ``step`` (default: the last logged) as transcripts, after a line
    saying the step, how many rollouts it played and how many were left unscored; none, saying why, where the run
    logged none (TRL's async trainer plays its rollouts in another process, whose scores this one never sees)."""
    folder = Path(output_dir) / ROLLOUTS
    if step is None and not any(folder.glob("step-*.jsonl")):
        print(f"no rollouts were logged in {folder}: they are logged where the trainer plays them in this process, "
              f"with env.metrics among its callbacks (not by TRL's async trainer)")
        return []
    step, rollouts = logged_rollouts(output_dir, step)
    scored = sorted((r for r in rollouts if r["reward"] is not None), key=lambda r: r["reward"])
    unscored = len(rollouts) - len(scored)
    print(f"step {step}: {len(rollouts)} rollouts" + (f", {unscored} left unscored" if unscored else "")
          + (f"; the best scored {scored[-1]['reward']:.2f}, the worst {scored[0]['reward']:.2f}" if scored else ""))
    shown = [scored[-1], scored[0]] if len(scored) > 1 else scored or rollouts[:1]
    return [transcript(rollout) for rollout in shown]


def try_it(model, tokenizer, env, day: int = 0, prompt: str = "", split: str = "eval", **play_kwargs) -> Rollout:
    """Play day ``day`` of ``split`` with ``model`` (greedy unless ``temperature=`` says otherwise); ``prompt`` in
    place of the task's own user message, when given."""
    rows = env.dataset_for(split)
    if not 0 <= day < len(rows):
        raise ValueError(f"day {day}: the {split!r} split has {len(rows)} tasks, 0 to {len(rows) - 1}")
    row = dict(rows[day])
    if prompt:
        asked = row["prompt"][:-1] if row["prompt"] and row["prompt"][-1]["role"] == "user" else row["prompt"]
        row["prompt"] = [*asked, {"role": "user", "content": prompt}]
    [rollout] = play(model, tokenizer, env.factory, [row], **play_kwargs)
    return rollout
