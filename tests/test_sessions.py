"""The session rules against a real agent_env server on loopback, and the recipe page's outage table at small
scale under TRL's GRPOTrainer and the kit's: a restarting server costs the rollouts in flight, not the ones after it, and a
slot another session took costs one rollout, not the step.

Bundles here deploy no env (an agent, a prompt, a response verifier), so they run without Docker.
"""

import asyncio
import logging
import threading

import pytest

from .conftest import TRAINERS, grpo, one_turn_task, step_logs, warnings, write_bundle

from agentenv_nb import AgentEnv
from agentenv_nb.client.environment import player_of
from agentenv_nb.client.runtime import Runtime
from agentenv_nb.client.session import CapacityError, Session, SessionError, Timeout
from agentenv_nb.envs.serve.thread import serve_in_thread

TOKEN = "the-sessions-tests-token"  # a restarted server takes the same one, as the serve command does from its setting


def test_the_first_session_raises_at_capacity_saying_what_to_raise(answers):
    with serve_in_thread(answers, token=TOKEN, max_concurrent_envs=1) as server:
        async def run():
            holder = Session(server.url, token=TOKEN, patience=0.5)
            second = Session(server.url, token=TOKEN, patience=0.5)
            await holder.open()
            with pytest.raises(CapacityError, match="raise max_concurrent_envs"):
                await second.open()
            await holder.close()
            await second.open()  # the slot freed up
            await second.close()
        asyncio.run(run())


def test_a_dropped_session_waits_for_a_restarting_server_then_gives_up_after_its_bound(answers):
    server = serve_in_thread(answers, token=TOKEN, max_concurrent_envs=2)
    port = int(server.url.rsplit(":", 1)[1])

    async def run():
        session = Session(server.url, token=TOKEN, reset_timeout=5, patience=0.2)
        await session.open()
        assert (await session.reset("train", 0))["done"] is False
        server.close()
        restarted = []
        threading.Timer(1.0, lambda: restarted.append(serve_in_thread(answers, token=TOKEN, port=port))).start()
        assert (await session.reset("train", 1))["done"] is False  # waited past patience for the server
        assert restarted  # the server came back before the reset returned: it waited for it
        await session.close()
        restarted[0].close()
        short = Session(server.url, token=TOKEN, reset_timeout=0.5, patience=0.2)
        short.opened = True  # a session that was open before, so it waits max(patience, reset_timeout)
        with pytest.raises(SessionError, match=r"refused connections for max\(patience, reset_timeout\)=0.5s"):
            await short.reset("train", 0)
    asyncio.run(run())


def test_a_dropped_session_whose_slot_another_took_gives_up_after_patience(answers):
    server = serve_in_thread(answers, token=TOKEN, max_concurrent_envs=1)
    port = int(server.url.rsplit(":", 1)[1])

    async def run():
        session = Session(server.url, token=TOKEN, reset_timeout=3600, patience=0.5)
        await session.open()
        server.close()
        with serve_in_thread(answers, token=TOKEN, port=port, max_concurrent_envs=1) as again:
            taker = Session(again.url, token=TOKEN)
            await taker.open()
            with pytest.raises(CapacityError, match=r"none freed up within patience=0.5s"):
                # the short wait, not reset_timeout's hour
                await asyncio.wait_for(session.reset("train", 0), timeout=600)
            await taker.close()
    asyncio.run(run())


def test_every_wait_names_the_bound_that_ran_out(tmp_path):
    slow = write_bundle(tmp_path / "slow", {"slow": one_turn_task("42", poll=3)}, {"train": ["slow"]})
    with serve_in_thread(slow, token=TOKEN) as server:
        async def run():
            session = Session(server.url, token=TOKEN, reset_timeout=0.001, call_timeout=0.3, patience=1)
            await session.open()
            with pytest.raises(Timeout, match="no reply from .* within reset_timeout=0.001s"):
                await session.reset("train", 0)
            session.reset_timeout = 30
            await session.reset("train", 0)  # a fresh connection: the late reply can't answer this
            end_turn = {"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": "42"}}
            with pytest.raises(Timeout, match="no reply from .* within call_timeout=0.3s"):
                await session.step(end_turn)
            with pytest.raises(SessionError, match="the connection closed and the episode with it"):
                await session.step(end_turn)
            await session.close()
        asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_restart_costs_the_rollouts_in_flight_not_the_ones_after(answers, tiny_model, tmp_path, caplog, trainer):
    """The recipe page's outage table (https://www.agentenvframework.com/docs/training/unsloth): the server stops
    mid-episode in step 2 and is back 2 s later."""
    server = serve_in_thread(answers, token=TOKEN, max_concurrent_envs=4)
    port, back = int(server.url.rsplit(":", 1)[1]), []
    # patience at its default: it bounds the first handshake too, which a server thread in a busy trainer process
    # can take past half a second; reset_timeout is what waits out the outage
    env = AgentEnv(server.url, token=TOKEN, reset_timeout=30, plain_text_replies=True)

    def outage(completions, environments, trainer_state, **_):
        """Runs after step 2's rollouts and before their rewards, so their episodes are open: once every reset
        is answered (a reset still on its way would wait for the server, and score)."""
        if trainer_state.global_step == 1:
            for environment in environments:
                player_of(environment).episode.started.result(30)
            server.close()
            restart = lambda: back.append(  # noqa: E731
                serve_in_thread(answers, token=TOKEN, port=port, max_concurrent_envs=4))
            threading.Timer(2.0, restart).start()
        return [None] * len(completions)

    trainer = grpo(tiny_model, tmp_path, dataset=env.dataset, factory=env.factory, steps=4,
                   reward_funcs=[*env.reward_funcs, outage], callbacks=[env.metrics], trainer=trainer)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    env.close()
    back[0].close()
    logs = step_logs(trainer, "scores/answers/unscored")
    assert [log["scores/answers/unscored"] for log in logs] == [0.0, 1.0, 0.0, 0.0]
    assert logs[1]["rewards/answers/mean"] is None  # step 2 trained on nothing
    assert logs[2]["rewards/answers/mean"] is not None and logs[2]["step_time"] > 1  # step 3 waited, and scored
    assert "rollout left unscored: end_turn: the connection to" in warnings(caplog)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_slot_another_took_costs_one_rollout_not_the_step(answers, tiny_model, tmp_path, caplog, trainer):
    """The server restarts after step 1, and another client takes one of its two slots until step 2 ends."""
    server = {"now": serve_in_thread(answers, token=TOKEN, max_concurrent_envs=2)}
    url = server["now"].url
    env = AgentEnv(url, token=TOKEN, patience=2, plain_text_replies=True)  # bounds the first handshake too
    intruder, intruding = Session(url, token=TOKEN), Runtime("intruder")
    trainer = grpo(tiny_model, tmp_path, dataset=env.dataset, factory=env.factory, steps=3,
                   reward_funcs=env.reward_funcs, callbacks=[env.metrics], trainer=trainer)
    from transformers import TrainerCallback

    class Intrude(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the trainer's sessions are gone, and reopen at step 2's resets
                server["now"].close()
                server["now"] = serve_in_thread(answers, token=TOKEN, port=int(url.rsplit(":", 1)[1]),
                                                max_concurrent_envs=2)
                intruding.run(intruder.open(), 10, "the intruder's session")
            if state.global_step == 2:
                intruding.run(intruder.close(), 10, "the intruder's goodbye")

    trainer.add_callback(Intrude())
    with caplog.at_level(logging.WARNING):
        trainer.train()
    env.close()
    intruding.close(patience=1)
    server["now"].close()
    logs = step_logs(trainer, "scores/answers/unscored")
    assert [log["scores/answers/unscored"] for log in logs] == [0.0, 0.5, 0.0]
    assert logs[1]["rewards/answers/mean"] is not None  # step 2 trained on the rollout that scored
    assert "another session took this one's slot and none freed up within patience=2s" in warnings(caplog)
