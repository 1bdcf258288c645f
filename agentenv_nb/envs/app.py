"""A resolved bundle's OpenEnv app: ``agent_env.openenv.build_app`` behind the kit's ``guard``, with the log
filters a server needs, for any way of serving it (a thread, server processes, the serve command).

    app = build(resolve("bundles/gridsim-tiny", sandbox="process"), token="s3cret")
"""

from __future__ import annotations

import logging
import sys

from agentenv_nb import settings
from agentenv_nb.envs import tls
from agentenv_nb.envs.guard import Guard
from agentenv_nb.envs.resolve import Resolved
from agentenv_nb.envs.rewards import NAMES, Reward, rule


def build(resolved: Resolved, *, reward: Reward = None, token: str | None = None):
    """The bundle's OpenEnv app, every task as the split ``all`` plus one split per eval, requiring ``token`` when
    given and closing sessions idle for AGENTENV_NB_IDLE_TIMEOUT (``guard.Guard``). ``reward``: see ``rewards``."""
    from agent_env.a2a_agent import conversation_store
    from agent_env.store.routing import namespace_routing

    build_app = openenv_build_app()
    tls.share_default_context()  # agent_env makes an httpx client a request: each would parse the CA bundle again
    # The store looks conversations up by fields only these indexes serve; without them every lookup parses every
    # conversation it holds, and a long run's episodes slow down as it grows (docs/benchmarks.md). A bundle's
    # episodes are @local runs, whose conversations go to the @local namespace's own file: with routing on, the
    # indexes go there too, not only to the configured store's, which those episodes never write.
    with namespace_routing():
        conversation_store.ensure_indexes()
    # The episode's agent proxy is polled at an a2a card path a2a calls deprecated: one warning a poll, no news.
    logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app").setLevel(logging.ERROR)
    # An episode's end closes its in-process agent proxy while the env's long poll is still open: uvicorn says it
    # cancelled 0 tasks, and the proxy logs the poll's ClientDisconnect as an error with a traceback. Nothing failed.
    logging.getLogger("uvicorn.error").addFilter(_not_an_idle_shutdown)
    logging.getLogger("agentenv_protocol.a2a_agent.framework").addFilter(_not_a_client_disconnect)
    # The same poll cut off while a2a's JSON-RPC app reads its body: that logs the ClientDisconnect, then its reply
    # to a client that is gone, an internal error (-32603) whose message, the ClientDisconnect's, is empty
    jsonrpc = logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app")
    jsonrpc.addFilter(_not_a_client_disconnect)
    jsonrpc.addFilter(_not_a_reply_to_a_client_gone)
    try:
        app = build_app(resolved.folder, reward=rule(reward), sandbox=resolved.sandbox,
                        max_concurrent_envs=resolved.max_concurrent_envs)
    except ValueError as error:
        raise ValueError(several_scores(str(error))) from None
    return Guard(app, token, settings.get("idle_timeout"))


def several_scores(problem: str) -> str:
    """agent_env's refusal of tasks that record several scores and no ``reward=``, a line a task, as one line that
    names the combinations too (``rewards.NAMES``), not only a step id; any other problem as it is."""
    first, *tasks = problem.splitlines()
    if not (first.startswith("reward=") and tasks):
        return problem
    return (f"{tasks[0]}{f' (and {len(tasks) - 1} other tasks)' if len(tasks) > 1 else ''}; or combine them: "
            f"reward= (a notebook's REWARD) {', '.join(map(repr, NAMES))} of the scores")


def openenv_build_app():
    """agent_env's ``build_app``, imported without the Gradio web UI that OpenEnv's server package imports whenever
    Gradio is installed (seconds of CPU in each server process): the kit's servers serve no web UI (the guard answers
    its routes with 404), and OpenEnv goes without it where Gradio doesn't import. Gradio imports as before after."""
    hidden = "gradio" not in sys.modules
    if hidden:
        sys.modules["gradio"] = None  # importing it raises ModuleNotFoundError, which OpenEnv takes as "not installed"
    try:
        from agent_env.openenv import build_app
    finally:
        if hidden and "gradio" in sys.modules and sys.modules["gradio"] is None:
            del sys.modules["gradio"]
    return build_app


def warnings_and_up(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _not_an_idle_shutdown(record: logging.LogRecord) -> bool:
    return not (str(record.msg).startswith("Cancel %s running task(s)") and record.args == (0,))


def _not_a_client_disconnect(record: logging.LogRecord) -> bool:
    return not (record.exc_info and type(record.exc_info[1]).__name__ == "ClientDisconnect")


def _not_a_reply_to_a_client_gone(record: logging.LogRecord) -> bool:
    return not (str(record.msg).startswith("Request Error") and isinstance(record.args, tuple)
                and record.args[1:3] == (-32603, ""))
