"""Envs for every rank of a data-parallel run: one set of env servers that all ranks play, sized for all of them.

Under ``torchrun`` or ``accelerate launch`` each rank is a process with its own trainer and its own share of each
generation batch (TRL samples the same prompts on every rank and accelerate hands each rank its slice), so each rank
opens its own sessions. Rank 0 serves the bundle (``AgentEnv.local``) and sends the servers' URLs to the other ranks
over ``torch.distributed``; or every rank plays servers started elsewhere (``AgentEnv(urls)``: an env host, Modal).

    state = PartialState()
    limit = sized_for_ranks(config)                     # N x (a rank's rollouts of a step + its eval batch)
    if problem := capacity_problem(config, limit): raise SystemExit(problem)
    env = envs_for_ranks(state, lambda: AgentEnv.local(bundle, processes=8, max_concurrent_envs=limit))
    ...
    close_for_ranks(state, env)                         # clients first, then rank 0's servers
"""

from __future__ import annotations

from collections.abc import Callable

from agentenv_nb.client import AgentEnv
from agentenv_nb.train.presets import concurrent_sessions


def rank_rollouts(config) -> int:
    """The sessions one rank keeps busy: a step's rollouts and, where it evaluates, an eval batch."""
    step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    return step + (config.per_device_eval_batch_size if config.eval_strategy != "no" else 0)


def sized_for_ranks(config) -> int:
    """The env servers' ``max_concurrent_envs`` for every rank of ``config``'s run, as a notebook's 64 is for one:
    each rank's rollouts of a step plus its eval batch (``rank_rollouts``), times the ranks."""
    return config.world_size * rank_rollouts(config)


def capacity_problem(config, max_concurrent_envs: int) -> str | None:
    """Why servers holding ``max_concurrent_envs`` sessions in all can't serve every rank at once, or None."""
    needed = concurrent_sessions(config)  # a generation or eval batch of every rank: TRL's config counts the ranks
    if max_concurrent_envs >= needed:
        return None
    ranks = config.world_size
    return (f"the env servers hold {max_concurrent_envs} sessions, but {ranks} rank{'s' * (ranks > 1)} open {needed} "
            f"at once (a generation or eval batch each, whichever is larger); pass --max-concurrent-envs "
            f"{sized_for_ranks(config)} (and serve with it), or launch fewer ranks")


def envs_for_ranks(state, serve: Callable[[], AgentEnv] | None = None, urls: list[str] | None = None,
                   split: str = "train") -> AgentEnv:
    """This rank's ``AgentEnv``: with ``urls``, every rank plays those servers; else rank 0 calls ``serve`` and the
    others play its servers, whose URLs they receive from rank 0. Each rank starts on a different server of the
    list, so the ranks' first sessions don't all land on one."""
    from accelerate.utils import broadcast_object_list

    env = None
    if urls is None:
        if state.is_main_process:
            env = serve()
        shared = broadcast_object_list([env.urls if env is not None else None])
        urls = shared[0]
    if env is None:
        turn = state.process_index % len(urls)
        env = AgentEnv(urls[turn:] + urls[:turn], split=split)
    return env


def close_for_ranks(state, env: AgentEnv) -> None:
    """Close every rank's sessions before rank 0 stops the servers they play, so no rank sees its server vanish."""
    if not state.is_main_process or env.server is None:
        env.close()
    state.wait_for_everyone()
    if state.is_main_process and env.server is not None:
        env.close()
