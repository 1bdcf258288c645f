"""What an AgentEnv hands TRL's GRPOTrainer besides its dataset and factory: ``ScoreLog``, a TrainerCallback that
logs each of a task's scores, and ``read_plain_text_replies``, a reward function that passes the model's plain-text
answer to the task.

    env = AgentEnv.local("bundles/inbox", reward=mean, plain_text_replies=True)
    trainer = GRPOTrainer(..., environment_factory=env.factory, reward_funcs=env.reward_funcs,
                          callbacks=[env.metrics])
    # logs scores/<bundle>/<step id>/mean and scores/<bundle>/unscored, with eval_ copies in evals

TRL 1.15 calls an environment's ``get_reward()`` with nothing, so neither can go through it: the callback puts the
scores into the trainer's logs, and the reward function, which TRL runs before ``get_reward()`` and hands the
completions and the environments, gives each environment its reply.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .stack import hide_broken_torchvision

hide_broken_torchvision()  # a broken torchvision breaks every import of transformers' trainer

from transformers import TrainerCallback  # noqa: E402


class ScoreLog(TrainerCallback):
    """Logs the mean of each score the tasks recorded since the last log, ``scores/<bundle>/<step id>/mean``, and
    the fraction of rollouts left unscored, ``scores/<bundle>/unscored``; in an eval's log as ``eval_scores/...``.

    It writes into the log the callbacks after it see (list it before those that read logs, ``callbacks=[env.metrics,
    live]``), the progress bar and ``trainer.state.log_history``; the ``report_to`` integrations log before any
    callback passed in, so they don't see the scores."""

    def __init__(self):
        self._pending: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._model = None

    def record(self, environment: str, scores: dict[str, float] | None) -> None:
        """One rollout's scores by step id, or None when it was left unscored; filed under the trainer's mode."""
        mode = "eval" if self._model is not None and not self._model.training else "train"
        pending = self._pending[mode]
        pending[f"scores/{environment}/unscored"].append(float(scores is None))
        for step, score in (scores or {}).items():
            pending[f"scores/{environment}/{step}/mean"].append(float(score))

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._model = model

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._model = model

    def on_log(self, args, state, control, logs: dict[str, Any] | None = None, **kwargs):
        if logs is None:
            return
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        metrics = {prefix + key: sum(values) / len(values) for key, values in self._pending[mode].items() if values}
        self._pending[mode].clear()
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


def read_plain_text_replies(completions: list, environments: list | None = None, **_: Any) -> list[None]:
    """Give each environment its completion's last plain-text reply, which ends the turn when the model never
    called ``end_turn``; scores nothing (None), so the environment's own reward stands alone."""
    for completion, environment in zip(completions, environments or (), strict=False):
        take = getattr(environment, "_take_reply", None)
        if take is not None:
            take(last_reply(completion))
    return [None] * len(completions)


def last_reply(completion: list[dict[str, Any]] | str) -> str:
    """The text of the completion's last assistant message."""
    if isinstance(completion, str):
        return completion.strip()
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content.strip()
    return ""
