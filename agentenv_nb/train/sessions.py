"""How many env sessions a run holds open at once: the one number the env servers' ``max_concurrent_envs`` is sized
from, on one GPU or many, and checked against.

    limit = sessions_needed(config)                  # serve with it: AgentEnv.local(bundle, max_concurrent_envs=limit)
    if problem := capacity_problem(config, served): raise SystemExit(problem)
    limit = play_sessions(preset, toolsets)          # notebook 02's: its greedy evals, an eval batch at a time

TRL makes one environment per rollout in flight and reuses them for training and eval, per environment class, so
its pool grows to the larger of a generation batch (a step's rollouts, every rank's: TRL's config counts the ranks)
and an eval batch (every rank's); ``environments`` is the number of classes of a dict ``environment_factory``. TRL's
AsyncGRPOTrainer holds one a rollout in flight (``max_inflight_tasks``), a pool a class too, and has no eval loop. The
trainer's environments keep their sessions after ``train()``, so anything else that plays then needs room of its own.
"""

from __future__ import annotations


def sessions_needed(config, environments: int = 1, beside: int = 0) -> int:
    """The sessions a GRPO run of ``config`` (every rank of it) opens at once, and ``beside`` more for players outside
    the trainer that play while its environments still hold theirs (a transcript after training)."""
    eval_batch = config.per_device_eval_batch_size * config.world_size if config.eval_strategy != "no" else 0
    rollouts = getattr(config, "max_inflight_tasks", None) or config.generation_batch_size  # async's, or a step's
    return environments * max(rollouts, eval_batch) + beside


def play_sessions(preset, environments: int = 1) -> int:
    """The sessions greedy play with ``preset`` (a ``Preset``) holds at once: its eval batch, which notebook 02
    plays its evals and self-distillation's rollouts in (and its expert's demonstrations as many at once), for each of
    ``environments`` classes: ``rollout.play`` keeps a pool a class, as TRL does."""
    return environments * preset.per_device_eval_batch_size


def capacity_problem(config, max_concurrent_envs: int, environments: int = 1, beside: int = 0) -> str | None:
    """Why servers holding ``max_concurrent_envs`` sessions in all can't hold the run's (and ``beside`` more), or None
    when they can."""
    needed = sessions_needed(config, environments, beside)
    if max_concurrent_envs >= needed:
        return None
    ranks = config.world_size
    return (f"the env servers' max_concurrent_envs={max_concurrent_envs} is below the {needed} sessions "
            f"{'this trainer opens' if ranks == 1 else f'{ranks} ranks open'} at once (a step's rollouts or an eval "
            f"batch, whichever is larger{f', and {beside} for the greedy eval after training' if beside else ''}), "
            "so the servers refuse the rest (CAPACITY_REACHED); serve with "
            f"--max-concurrent-envs {needed} or more, or lower the trainer's batch")
