"""``ScoreLog``, the TrainerCallback ``AgentEnv.metrics`` gives TRL's GRPOTrainer: it logs each of a task's scores.

    env = AgentEnv.local("bundles/inbox", reward=mean, plain_text_replies=True)
    trainer = GRPOTrainer(..., environment_factory=env.factory, reward_funcs=env.reward_funcs,
                          callbacks=[env.metrics])
    # logs scores/<bundle>/<step id>/mean and scores/<bundle>/unscored, with eval_ copies in evals

TRL 1.15 calls an environment's ``get_reward()`` with nothing, and logs only the reward: the callback puts the
scores into the trainer's logs.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from agentenv_nb.stack import hide_broken_torchvision

hide_broken_torchvision()  # a broken torchvision breaks every import of transformers' trainer

from transformers import TrainerCallback  # noqa: E402


ROLLOUTS = "rollouts"  # the folder in a run's output_dir: step-<N>.jsonl, a training rollout's transcript a line


class ScoreLog(TrainerCallback):
    """Logs the mean of each score the tasks recorded since the last log, ``scores/<bundle>/<step id>/mean``, and
    the fraction of rollouts left unscored, ``scores/<bundle>/unscored``; in an eval's log as ``eval_scores/...``.

    Each log's training rollouts, their transcripts (the prompt, each tool call and its result, the reply) and
    scores, go to ``<output_dir>/rollouts/step-<N>.jsonl`` (``notebook.transcript.best_and_worst`` reads them).
    ``tool_failures`` counts each (tool, error) of a tool call that failed on the server, and ``unscored_errors``
    each error that left a rollout unscored (a session closed idle, a turn out of time), which the run's health lines
    (``train.health``) name.

    A rollout played inside a training step is a training one; any other (an evaluation's) is an eval one. The
    model's ``training`` flag can't tell them apart: Unsloth's GRPOTrainer puts the model back in training mode after
    it generates, before the rewards, evaluating or not.

    It writes into the log the callbacks after it see, and ``trainer.state.log_history``. transformers puts the
    ``report_to`` integrations before any callback passed in; ``agentenv_nb.train.fit`` moves this one first, so
    TensorBoard, trackio and W&B log the scores too."""

    def __init__(self):
        self._pending: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._in_step = False  # between the trainer's on_step_begin and on_step_end
        self._lock = threading.Lock()  # environments record from the threads that play them
        self.tool_failures: Counter[tuple[str, str]] = Counter()  # (tool, error): how often, the whole run
        self.unscored_errors: Counter[str] = Counter()  # why rollouts were left unscored: how often, the whole run
        self._rollouts: list[dict] = []  # the training rollouts since the last log

    def record(self, environment: str, scores: dict[str, float] | None, rollout: dict | None = None) -> None:
        """One rollout's scores by step id, or None when it was left unscored; a training step's while one is under
        way, else an eval's. A training rollout's transcript (``rollout``: task_id, messages, reward) goes to the
        step's rollouts file."""
        mode = "train" if self._in_step else "eval"
        with self._lock:
            if rollout is not None and mode == "train":
                self._rollouts.append(rollout)
            pending = self._pending[mode]
            pending[f"scores/{environment}/unscored"].append(float(scores is None))
            if scores is None:
                self.unscored_errors[_first_line((rollout or {}).get("error"))] += 1
            for step, score in (scores or {}).items():
                pending[f"scores/{environment}/{step}/mean"].append(float(score))

    def record_failure(self, tool: str, error: str) -> None:
        """One failed tool call: the tool and its error, which the run's health line names."""
        with self._lock:
            self.tool_failures[tool, _first_line(error)] += 1

    def discard(self) -> None:
        """Forget what was recorded since the last log, and the tool failures: a trial step's, which is no step."""
        with self._lock:
            for pending in self._pending.values():
                pending.clear()
            self._rollouts.clear()
            self.tool_failures.clear()
            self.unscored_errors.clear()

    def on_train_begin(self, args, state, control, **kwargs):
        self.discard()  # what was played before training (a greedy eval, say) is no step's and no eval's of it

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_step = True

    def on_step_end(self, args, state, control, **kwargs):
        self._in_step = False

    def on_log(self, args, state, control, logs: dict[str, Any] | None = None, **kwargs):
        if logs is None:
            return
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        with self._lock:
            metrics = {prefix + key: sum(values) / len(values) for key, values in self._pending[mode].items() if values}
            self._pending[mode].clear()
            rollouts, self._rollouts = (self._rollouts, []) if mode == "train" else ([], self._rollouts)
        if rollouts and state.is_world_process_zero:
            folder = Path(args.output_dir) / ROLLOUTS
            folder.mkdir(parents=True, exist_ok=True)
            with (folder / f"step-{state.global_step:05d}.jsonl").open("a", encoding="utf-8") as file:
                file.writelines(json.dumps(rollout, default=str) + "\n" for rollout in rollouts)
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


def _first_line(error: str | None) -> str:
    return error.splitlines()[0][:200] if error else "no message"
