"""Seed 001's session rules against a real agent_env server on loopback, and seeds/000's outage table at small
scale under TRL's GRPOTrainer: a restarting server costs the rollouts in flight, not the ones after it, and a
slot another session took costs one rollout, not the step.

Bundles here deploy no env (an agent, a prompt, a response verifier), so they run without Docker.
"""

import asyncio
import json
import logging
import threading
import time

import pytest

from agentenv_nb import AgentEnv
from agentenv_nb.serve import serve_in_thread
from agentenv_nb.session import CapacityError, Session, SessionError, Timeout
from agentenv_nb.stack import import_unsloth


def turn(prompt_id: str, prompt: str, after: str, poll: float = 0.1) -> dict:
    return {"id": prompt_id, "type": "prompt_agent", "agent_name": "player", "prompt_id": prompt_id,
            "depends_on": [after], "prompt": prompt, "poll_interval_seconds": poll}


def verifier(step_id: str, prompt_id: str, after: str, *criteria: tuple[str, str, float]) -> dict:
    """A response verifier scoring the weighted share of ``criteria`` (kind, needle or pattern, weight) met."""
    rows = [{"type": kind, "needles": [text]} if kind == "response_contains" else
            {"type": kind, "pattern": text} for kind, text, _ in criteria]
    return {"id": step_id, "type": "agent_prompt_response_verifier", "prompt_id": prompt_id, "verifier_id": step_id,
            "score_aggregator": "weighted_average", "depends_on": [after],
            "criteria": [{**row, "weight": weight} for row, (_, _, weight) in zip(rows, criteria, strict=True)]}


def one_turn_task(answer: str, system_prompt: str = "Answer with end_turn.", poll: float = 0.1) -> list[dict]:
    """Asks for ``answer``: 1.0 for a reply containing it, 0.5 for a reply with a letter in it, else 0."""
    return [{"id": "deploy", "type": "deploy_agent", "agent_name": "player", "system_prompt": system_prompt},
            turn("ask", f"Say {answer}.", "deploy", poll),
            verifier("check", "ask", "ask", ("response_contains", answer, 1), ("response_regex_present", "[a-z]", 1))]


def write_bundle(root, tasks: dict[str, list[dict]], evals: dict[str, list[str]]):
    """A bundle folder: tasks/<name>.json and evals/<name>.toml (each eval a split)."""
    (root / "tasks").mkdir(parents=True)
    (root / "evals").mkdir()
    for name, steps in tasks.items():
        (root / "tasks" / f"{name}.json").write_text(json.dumps(steps))
    for name, members in evals.items():
        (root / "evals" / f"{name}.toml").write_text(f"tasks = {json.dumps(members)}\n")
    return root


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny Qwen3-format model: it writes plain text, which plain_text_replies hands the task."""
    from agentenv_nb.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def grpo(model_path, out, *, dataset, factory, steps, eval_dataset=None, reward_funcs=(), callbacks=(), **config):
    """TRL's GRPOTrainer on CPU (unsloth first, as TRL 1.15 needs): LoRA on the tiny model, two rollouts a step as
    one group, short completions, a log a step; ``config`` overrides GRPOConfig's arguments."""
    import_unsloth()
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**{
        "output_dir": str(out), "max_steps": steps, "per_device_train_batch_size": 2, "num_generations": 2,
        "max_completion_length": 24, "learning_rate": 1e-3, "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "use_cpu": True, "bf16": False, "seed": 0, "temperature": 1.0,
        "chat_template_kwargs": {"enable_thinking": False}, **config})
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path),
                       processing_class=AutoTokenizer.from_pretrained(model_path), args=args,
                       train_dataset=dataset, eval_dataset=eval_dataset, environment_factory=factory,
                       reward_funcs=list(reward_funcs), callbacks=list(callbacks),
                       peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def warnings(caplog) -> str:
    """The warnings logged, one a line (caplog.text misses those logged while TRL's trainer runs)."""
    return "\n".join(record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING)


def step_logs(trainer, key: str) -> list[dict]:
    return [log for log in trainer.state.log_history if key in log]


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Four one-turn tasks: train a1..a4, eval a1."""
    tasks = {f"a{i}": one_turn_task(str(40 + i)) for i in range(1, 5)}
    return write_bundle(tmp_path_factory.mktemp("bundles") / "answers", tasks, {"train": list(tasks), "eval": ["a1"]})


def test_the_first_session_raises_at_capacity_saying_what_to_raise(answers):
    with serve_in_thread(answers, max_concurrent_envs=1) as server:
        async def run():
            holder, second = Session(server.url, patience=0.5), Session(server.url, patience=0.5)
            await holder.open()
            with pytest.raises(CapacityError, match="raise max_concurrent_envs"):
                await second.open()
            await holder.close()
            await second.open()  # the slot freed up
            await second.close()
        asyncio.run(run())


def test_a_dropped_session_waits_for_a_restarting_server_then_gives_up_after_its_bound(answers):
    server = serve_in_thread(answers, max_concurrent_envs=2)
    port = int(server.url.rsplit(":", 1)[1])

    async def run():
        session = Session(server.url, reset_timeout=5, patience=0.2)
        await session.open()
        assert (await session.reset("train", 0))["done"] is False
        server.close()
        restarted = []
        threading.Timer(1.0, lambda: restarted.append(serve_in_thread(answers, port=port))).start()
        start = time.monotonic()
        assert (await session.reset("train", 1))["done"] is False  # waited past patience for the server
        assert time.monotonic() - start > 0.9
        await session.close()
        restarted[0].close()
        short = Session(server.url, reset_timeout=0.5, patience=0.2)
        short.opened = True  # a session that was open before, so it waits max(patience, reset_timeout)
        with pytest.raises(SessionError, match=r"refused connections for max\(patience, reset_timeout\)=0.5s"):
            await short.reset("train", 0)
    asyncio.run(run())


def test_a_dropped_session_whose_slot_another_took_gives_up_after_patience(answers):
    server = serve_in_thread(answers, max_concurrent_envs=1)
    port = int(server.url.rsplit(":", 1)[1])

    async def run():
        session = Session(server.url, reset_timeout=30, patience=0.5)
        await session.open()
        server.close()
        with serve_in_thread(answers, port=port, max_concurrent_envs=1) as again:
            taker = Session(again.url)
            await taker.open()
            start = time.monotonic()
            with pytest.raises(CapacityError, match=r"none freed up within patience=0.5s"):
                await session.reset("train", 0)
            assert time.monotonic() - start < 3  # the short wait, not reset_timeout
            await taker.close()
    asyncio.run(run())


def test_every_wait_names_the_bound_that_ran_out(tmp_path):
    slow = write_bundle(tmp_path / "slow", {"slow": one_turn_task("42", poll=3)}, {"train": ["slow"]})
    with serve_in_thread(slow) as server:
        async def run():
            session = Session(server.url, reset_timeout=0.001, call_timeout=0.3, patience=1)
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


def test_a_restart_costs_the_rollouts_in_flight_not_the_ones_after(answers, tiny_model, tmp_path, caplog):
    """Seeds/000's outage table: the server stops mid-episode in step 2 and is back 2 s later."""
    server = serve_in_thread(answers, max_concurrent_envs=4)
    port, back = int(server.url.rsplit(":", 1)[1]), []
    env = AgentEnv(server.url, reset_timeout=30, patience=0.5, plain_text_replies=True)

    def outage(completions, environments, trainer_state, **_):
        """Runs after step 2's rollouts and before their rewards, so their episodes are open: once every reset
        is answered (a reset still on its way would wait for the server, and score)."""
        if trainer_state.global_step == 1:
            for environment in environments:
                environment._episode.started.result(30)
            server.close()
            restart = lambda: back.append(serve_in_thread(answers, port=port, max_concurrent_envs=4))  # noqa: E731
            threading.Timer(2.0, restart).start()
        return [None] * len(completions)

    trainer = grpo(tiny_model, tmp_path, dataset=env.dataset, factory=env.factory, steps=4,
                   reward_funcs=[*env.reward_funcs, outage], callbacks=[env.metrics])
    with caplog.at_level(logging.WARNING):
        trainer.train()
    env.close()
    back[0].close()
    logs = step_logs(trainer, "scores/answers/unscored")
    assert [log["scores/answers/unscored"] for log in logs] == [0.0, 1.0, 0.0, 0.0]
    assert logs[1]["rewards/answers/mean"] is None  # step 2 trained on nothing
    assert logs[2]["rewards/answers/mean"] is not None and logs[2]["step_time"] > 1  # step 3 waited, and scored
    assert "rollout left unscored: end_turn: the connection to" in warnings(caplog)


def test_a_slot_another_took_costs_one_rollout_not_the_step(answers, tiny_model, tmp_path, caplog):
    """The server restarts after step 1, and another client takes one of its two slots until step 2 ends."""
    server = {"now": serve_in_thread(answers, max_concurrent_envs=2)}
    url = server["now"].url
    env = AgentEnv(url, patience=1, plain_text_replies=True)
    intruder = Session(url)
    trainer = grpo(tiny_model, tmp_path, dataset=env.dataset, factory=env.factory, steps=3,
                   reward_funcs=env.reward_funcs, callbacks=[env.metrics])
    from transformers import TrainerCallback

    class Intrude(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the trainer's sessions are gone, and reopen at step 2's resets
                server["now"].close()
                server["now"] = serve_in_thread(answers, port=int(url.rsplit(":", 1)[1]), max_concurrent_envs=2)
                env.run(intruder.open(), 10, "the intruder's session")
            if state.global_step == 2:
                env.run(intruder.close(), 10, "the intruder's goodbye")

    trainer.add_callback(Intrude())
    with caplog.at_level(logging.WARNING):
        trainer.train()
    env.close()
    server["now"].close()
    logs = step_logs(trainer, "scores/answers/unscored")
    assert [log["scores/answers/unscored"] for log in logs] == [0.0, 0.5, 0.0]
    assert logs[1]["rewards/answers/mean"] is not None  # step 2 trained on the rollout that scored
    assert "another session took this one's slot and none freed up within patience=1s" in warnings(caplog)
