"""The reward of a task that records several scores, as ``reward=`` says: a score's step id, a name ("mean",
"min", "max" of the scores), or a function of the scores by step id. Names and the combinators here pickle, so
they reach server processes too (``envs.serve.processes``); a lambda doesn't.

    AgentEnv.local(bundle, reward="mean", processes=8)
    AgentEnv.local(bundle, reward=Weighted({"answer": 3, "format": 1}), processes=8)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass

Reward = str | Callable[[dict[str, float]], float] | None  # a step id, a name, or a function of the scores by step id


def _scored(scores: dict[str, float]) -> list[float]:
    if not scores:
        raise LookupError("the run recorded no score")
    return list(scores.values())


def mean(scores: dict[str, float]) -> float:
    """The mean of the task's scores."""
    values = _scored(scores)
    return sum(values) / len(values)


def lowest(scores: dict[str, float]) -> float:
    """The lowest of the task's scores: a reward only as good as the worst verifier's."""
    return min(_scored(scores))


def highest(scores: dict[str, float]) -> float:
    """The highest of the task's scores."""
    return max(_scored(scores))


NAMES: dict[str, Callable[[dict[str, float]], float]] = {"mean": mean, "min": lowest, "max": highest}


@dataclass(frozen=True)
class Weighted:
    """The weighted mean of the scores at the step ids ``weights`` names; a step the run didn't score is an
    error, so the episode goes unscored rather than half-rewarded."""

    weights: dict[str, float]

    def __call__(self, scores: dict[str, float]) -> float:
        missing = sorted(set(self.weights) - set(scores))
        if missing:
            raise LookupError(f"the run recorded no score at {', '.join(missing)}; it recorded {sorted(scores)}")
        return sum(scores[step] * weight for step, weight in self.weights.items()) / sum(self.weights.values())


def rule(reward: Reward) -> Reward:
    """What agent_env's ``build_app(reward=)`` takes: a name made its function; a step id, a function, or None
    as given."""
    return NAMES.get(reward, reward) if isinstance(reward, str) else reward


def pickled(reward: Reward) -> bytes:
    """``reward`` as bytes a server process reads back (``unpickled``); raises ValueError saying what to pass
    instead when it can't be pickled, as a lambda or a function defined inside another can't."""
    try:
        return pickle.dumps(reward)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ValueError(f"reward={reward!r} can't reach a server process ({e}): pass a name ({', '.join(NAMES)}), "
                         "a score's step id, rewards.Weighted({...}), or a function defined at the top level of a "
                         "module; or serve on a thread (processes=0)") from None


def unpickled(data: bytes) -> Reward:
    """The reward ``pickled`` wrote, read back in a server process. Only for bytes this user's own process wrote
    into its private folder: unpickling runs code."""
    return pickle.loads(data)  # noqa: S301 - written by the parent process into a 0700 folder of this user's
