"""Envs for every rank of a data-parallel run: one set of env servers that all ranks play, sized for all of them.

Under ``torchrun`` or ``accelerate launch`` each rank is a process with its own trainer and its own share of each
generation batch (TRL samples the same prompts on every rank and accelerate hands each rank its slice), so each rank
opens its own sessions. Rank 0 serves the bundle (``AgentEnv.local``) and sends the servers' URLs to the other ranks
over ``torch.distributed``; or every rank plays servers started elsewhere (``AgentEnv(urls)``: an env host, Modal).

    state = PartialState()
    limit = sessions.sessions_needed(config)            # every rank's sessions: TRL's config counts the ranks
    env = envs_for_ranks(state, lambda: AgentEnv.local(bundle, processes=8, max_concurrent_envs=limit))
    ...
    close_for_ranks(state, env)                         # clients first, then rank 0's servers
"""

from __future__ import annotations

from collections.abc import Callable

from agentenv_nb.client import AgentEnv


def envs_for_ranks(state, serve: Callable[[], AgentEnv] | None = None, urls: list[str] | None = None,
                   split: str = "train") -> AgentEnv:
    """This rank's ``AgentEnv``: with ``urls``, every rank plays those servers (with AGENTENV_NB_TOKEN's token); else
    rank 0 calls ``serve`` and the others play its servers, whose URLs and token they receive from rank 0. Each rank
    starts on a different server of the list, so the ranks' first sessions don't all land on one."""
    from accelerate.utils import broadcast_object_list

    env, token = None, None
    if urls is None:
        if state.is_main_process:
            env = serve()
        urls, token = broadcast_object_list([env.urls, env.token] if env is not None else [None, None])
    if env is None:
        turn = state.process_index % len(urls)
        env = AgentEnv(urls[turn:] + urls[:turn], split=split, token=token)  # else AGENTENV_NB_TOKEN's
    return env


def close_for_ranks(state, env: AgentEnv) -> None:
    """Close every rank's sessions before rank 0 stops the servers they play, so no rank sees its server vanish."""
    if not state.is_main_process or env.server is None:
        env.close()
    state.wait_for_everyone()
    if state.is_main_process and env.server is not None:
        env.close()
