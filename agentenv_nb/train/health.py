"""A run's health in words: each signal of a GRPO run with its threshold and its advice, said once when crossed.

``RULES`` is the data (signal, threshold, what it means, what to do); ``HealthCheck`` is the TrainerCallback that
checks them at each log, says each rule's line once (under the live plot in a notebook, as plain text the saved
notebook keeps; printed elsewhere) and appends it to ``<output_dir>/health.jsonl`` beside the trainer's logs.
``agentenv_nb.train.fit`` adds one to every run; docs/run-health.md says what each line means.

    trainer = GRPOTrainer(..., callbacks=[env.metrics, live, HealthCheck(scores=env.metrics)])
    # "health, step 3: 100% of groups scored alike ... Raise temperature or num_generations ..."

Key names are TRL 1.15 GRPOTrainer's and ``ScoreLog``'s (``scores/<bundle>/unscored``); a missing key is no signal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from agentenv_nb.stack import hide_broken_torchvision
from agentenv_nb.train.progress import log_numbers

hide_broken_torchvision()  # a broken torchvision breaks every import of transformers' trainer
from transformers import TrainerCallback  # noqa: E402
from transformers.utils.import_utils import is_in_notebook  # noqa: E402

Rows = list[dict[str, float]]


def _latest(key: str) -> Callable[[Rows], float | None]:
    def signal(rows: Rows) -> float | None:
        values = _series(rows, key)
        return values[-1] if values else None
    return signal


def _series(rows: Rows, key: str) -> list[float]:
    return [row[key] for row in rows if key in row and not math.isnan(row[key])]


def unscored(rows: Rows) -> float | None:
    """The share of the last log's rollouts left unscored, training's or an eval's, the worst bundle's
    (``ScoreLog``'s metric)."""
    shares = [v for k, v in (rows[-1] if rows else {}).items()
              if k.startswith(("scores/", "eval_scores/")) and k.endswith("/unscored") and not math.isnan(v)]
    return max(shares) if shares else None


def reward_up_eval_down(rows: Rows) -> float | None:
    """The lesser of the train reward's rise and the eval reward's fall since the first of each: above 0 when both
    moved apart (the reward may be hacked, or the model overfits the train split)."""
    rewards, evals = _series(rows, "reward"), _series(rows, "eval_reward")
    if len(rewards) < 2 or len(evals) < 2:
        return None
    recent = rewards[-max(1, len(rewards) // 4):]  # the last quarter's mean: one lucky step is no trend
    return min(sum(recent) / len(recent) - rewards[0], evals[0] - evals[-1])


def eval_fall(rows: Rows) -> float | None:
    """The share of the first eval reward lost since: 1.0 where the eval reward fell to zero; none before a second
    eval, nor from a first of zero."""
    evals = _series(rows, "eval_reward")
    if len(evals) < 2 or evals[0] <= 0:
        return None
    return 1 - evals[-1] / evals[0]


def length_drift(rows: Rows) -> float | None:
    """How many times longer (or shorter) the completions are than at the first step."""
    lengths = _series(rows, "completions/mean_length")
    if len(lengths) < 2 or min(lengths[0], lengths[-1]) <= 0:
        return None
    return max(lengths[-1] / lengths[0], lengths[0] / lengths[-1])


def tools_dropped(rows: Rows) -> float | None:
    """Tool calls a rollout now, where the run once called at least one a rollout; else no signal."""
    calls = _series(rows, "tools/call_frequency")
    return calls[-1] if len(calls) >= 2 and max(calls[:-1]) >= 0.5 else None


@dataclass(frozen=True)
class Rule:
    """One signal of a run: crossed when ``signal(rows)`` is at or past ``threshold`` (below it where ``below``);
    ``says`` what that is, formatted with ``{value}``, ``advice`` what to do."""

    name: str
    signal: Callable[[Rows], float | None]
    threshold: float
    says: str
    advice: str
    below: bool = False

    def crossed(self, rows: Rows) -> float | None:
        """The signal's value where it is past the threshold, else None."""
        value = self.signal(rows)
        if value is None or math.isnan(value):
            return None
        return value if (value <= self.threshold if self.below else value >= self.threshold) else None


ABOVE_OPTIMUM = "above the optimum"
RULES = (
    Rule("no reward spread", _latest("frac_reward_zero_std"), 0.75,
         "{value:.0%} of groups scored all their rollouts alike: no advantage, so no gradient",
         "raise temperature or num_generations (rollouts a group); the task may be too easy or too hard for the "
         "model"),
    Rule("completions clipped", _latest("completions/clipped_ratio"), 0.25,
         "{value:.0%} of completions hit max_completion_length and were cut",
         "raise max_completion_length, or the model rambles (look at a rollout below)"),
    Rule("tool failures", _latest("tools/failure_frequency"), 0.2,
         "{value:.2f} failed tool calls a rollout{failure}",
         "read the tool's error: a wrong argument is the model's to learn; an error of the env is the bundle's to fix"),
    Rule("unscored rollouts", unscored, 0.1,
         "{value:.0%} of rollouts were left unscored{unscored}",
         "these rollouts train and measure nothing. Where a session closed idle or a turn ran out of time, the model "
         "generates slower than the env allows: raise AGENTENV_NB_IDLE_TIMEOUT, lower max_completion_length, or "
         "train on a GPU; otherwise check the env and its verifier play a task end to end"),
    Rule("reward up, eval down", reward_up_eval_down, 0.05,
         "the train reward rose while the eval reward fell (both by {value:.2f} or more)",
         "the model may be gaming the reward or overfitting the train split: read the best rollouts"),
    Rule("eval reward fell", eval_fall, 0.9,
         "the eval reward lost {value:.0%} of what it was at the start",
         "the updates undo what the model knew at the start (its warm start): lower the learning rate, to a third "
         "of it or less"),
    Rule("length drift", length_drift, 2.0,
         "completions are {value:.1f}x longer or shorter than at the first step",
         "read a rollout: rambling or truncated answers; a lower learning rate or max_completion_length holds it"),
    Rule("tools dropped", tools_dropped, 0.05,
         "the model calls {value:.2f} tools a rollout, where it called at least one before",
         "it has learnt to answer without the tools: check the reward needs them; lower the learning rate",
         below=True),
    Rule(ABOVE_OPTIMUM, _latest("reward"), math.inf,  # HealthCheck(optimum=) sets the threshold
         "a mean reward of {value:.3f}, above the task's known optimum {optimum:.3f}",
         "the verifier scores something the task's rules don't allow: read the best rollout"),
)


class HealthCheck(TrainerCallback):
    """Checks ``RULES`` at each log and says each crossed rule once, with its advice: in a notebook as plain text
    (the saved notebook keeps it), elsewhere printed; each line also goes to ``<output_dir>/health.jsonl``.

    ``scores``: the run's ``ScoreLog`` (``env.metrics``), whose tool failures name the tool and its error.
    ``optimum``: the best mean reward the task allows, where a task adapter knows it (GridSim's optimum)."""

    def __init__(self, scores=None, optimum: float | None = None, rules: tuple[Rule, ...] = RULES):
        self.scores, self.optimum = scores, optimum
        self.rules = tuple(replace(rule, threshold=optimum + 1e-6) if rule.name == ABOVE_OPTIMUM and optimum is not None
                           else rule for rule in rules)
        self.rows: Rows = []
        self.said: list[str] = []  # the lines said, in order
        self._crossed: set[str] = set()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.rows.append(log_numbers(logs or {}))
        for rule in self.rules:
            if rule.name in self._crossed or (value := rule.crossed(self.rows)) is None:
                continue
            self._crossed.add(rule.name)
            if not state.is_world_process_zero:  # the ranks of a multi-GPU run log alike: the main one says it
                continue
            line = (f"health, step {state.global_step}: {rule.name}: "
                    + rule.says.format(value=value, optimum=self.optimum or 0.0, failure=self._failure(),
                                       unscored=self._unscored())
                    + f". {rule.advice[0].upper()}{rule.advice[1:]}.")
            self.say(line)
            if args is not None:
                path = Path(args.output_dir) / "health.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as log:
                    log.write(json.dumps({"step": state.global_step, "rule": rule.name, "value": value,
                                          "threshold": rule.threshold, "line": line}) + "\n")

    def _failure(self) -> str:
        """ ", most often <tool>: <error>" where the run's ScoreLog saw a tool fail, else nothing."""
        failures = self.scores.tool_failures if self.scores is not None else None
        if not failures:
            return ""
        (tool, error), _ = failures.most_common(1)[0]
        return f", most often {tool}: {error}"

    def _unscored(self) -> str:
        """ ", most often: <error>" where the run's ScoreLog saw why a rollout was left unscored, else nothing."""
        errors = self.scores.unscored_errors if self.scores is not None else None
        if not errors:
            return " (the episode ended without a score; the library log says why)"
        return f", most often: {errors.most_common(1)[0][0]}"

    def say(self, line: str) -> None:
        self.said.append(line)
        if is_in_notebook():
            from IPython.display import display

            display({"text/plain": line}, raw=True)
        else:
            print(line, flush=True)
