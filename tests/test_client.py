"""``AgentEnv`` against real agent_env servers on loopback: its dataset, its factory's classes and what TRL 1.15
reads of them, multi-turn tasks and ``reward=``, unscored rollouts, the pre-training check, and GRPO on CPU with
a tiny Qwen3-format model: a dict factory over two bundles, and GridSim's tools called by a model taught to. The
factory pickled into a spawned process, as TRL 1.15's AsyncGRPOTrainer hands it to its rollout process
(``AsyncRolloutWorker.start``), plays GridSim there as that trainer plays it (reset on its event loop, tools on
threads, ``get_reward`` awaited as each rollout ends while others play on).

Bundles here deploy no env unless they are GridSim's, whose env runs as a process (sandbox "process").
"""

import asyncio
import inspect
import json
import logging
import multiprocessing
import pickle

import pytest
from .conftest import grpo, one_turn_task, step_logs, turn, verifier, warnings, write_bundle

from agentenv_nb import AgentEnv
from agentenv_nb.client.checks import CheckFailed
from agentenv_nb.client.environment import read_plain_text_replies
from agentenv_nb.notebook.transcript import logged_rollouts
from agentenv_nb.stack import import_unsloth
from agentenv_nb.tasks.gridsim import battery


def two_turn_task() -> list[dict]:
    """Says hello, then bye; a verifier a turn, so its reward needs ``reward=``."""
    return [{"id": "deploy", "type": "deploy_agent", "agent_name": "player", "system_prompt": "Use end_turn."},
            turn("hello", "Say hello.", "deploy"), turn("bye", "Say bye.", "hello"),
            verifier("greets", "hello", "bye", ("response_contains", "hello", 1)),
            verifier("parts", "bye", "bye", ("response_contains", "bye", 3), ("response_regex_present", "!$", 1))]


def mean(scores: dict[str, float]) -> float:
    return sum(scores.values()) / len(scores)


@pytest.fixture(scope="module")
def chat_bundle(tmp_path_factory):
    tasks = {"talk": two_turn_task(), "once": one_turn_task("7")}
    return write_bundle(tmp_path_factory.mktemp("bundles") / "chat", tasks, {"train": list(tasks)})


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def gridsim(tmp_path_factory):
    """A GridSim bundle of four train days and two eval days, its env a process (no Docker)."""
    from agentenv_nb.tasks.gridsim import write_bundle as write_gridsim

    bundle = write_gridsim(tmp_path_factory.mktemp("gridsim") / "gridsim-tiny", train=4, eval=2)
    with AgentEnv.local(bundle, sandbox="process", max_concurrent_envs=8) as env:
        yield env


def test_the_dataset_is_the_splits_tasks_as_chat_prompts(quiz):
    rows = quiz.dataset.to_list()
    assert [row["index"] for row in rows] == [0, 1] and {row["split"] for row in rows} == {"train"}
    assert rows[0]["prompt"] == [{"role": "system", "content": "Answer with end_turn."},
                                 {"role": "user", "content": "Say 41."}]
    assert rows[0]["task_id"].endswith("/q1") and rows[0]["environment"] == "quiz"
    assert quiz.dataset_for("eval")["task_id"][0].endswith("/q3")
    with pytest.raises(ValueError, match="serves no split 'test'; it serves all, eval, train"):
        quiz.dataset_for("test")


def test_the_factory_is_a_class_named_after_the_bundle_whose_methods_trl_reads(quiz):
    from transformers.utils import get_json_schema

    Quiz = quiz.factory
    assert Quiz.__name__ == "quiz"  # TRL logs rewards/quiz/mean
    schema = get_json_schema(Quiz().end_turn)["function"]
    assert schema["name"] == "end_turn" and schema["parameters"]["properties"]["response"]["type"] == "string"


def test_an_episode_plays_and_scores_and_a_failed_one_is_unscored(quiz, caplog):
    with quiz.factory() as play:  # outside a trainer: the with block closes its session
        assert play.reset(**quiz.dataset[0]) is None  # the prompt is the row's; the task starts in the background
        assert play.end_turn(response="41, done") == "The episode has ended."
        assert play.get_reward() == 1.0
        play.reset(**quiz.dataset[1])
        assert play.get_reward() == 0.0  # never ended its turn: the task got an empty reply
        play.reset(**quiz.dataset[1])
        read_plain_text_replies([[{"role": "assistant", "content": "It is 42"}]], environments=[play])
        assert play.get_reward() == 1.0  # the plain-text reply ended the turn
        with caplog.at_level(logging.WARNING):
            play.reset(split="train", index=9)
            assert play.get_reward() is None
    assert "rollout left unscored: reset: split 'train' has 2 tasks, so it has no task 9" in warnings(caplog)


@pytest.mark.parametrize("resolved", [False, True], ids=["a folder", "a resolved bundle"])
def test_the_first_reset_raises_when_the_server_has_no_room(quiz_bundle, resolved):
    """The session limit is ``AgentEnv.local``'s argument, for a bundle resolved already (with a limit of its own) as
    for a folder."""
    from agentenv_nb.client.session import CapacityError
    from agentenv_nb.envs.resolve import resolve

    bundle = resolve(quiz_bundle, max_concurrent_envs=8) if resolved else quiz_bundle
    with AgentEnv.local(bundle, max_concurrent_envs=1) as env, env.factory() as first:
        assert env.max_concurrent_envs == 1
        first.reset(**env.dataset[0])
        with pytest.raises(CapacityError, match="raise max_concurrent_envs"):
            env.factory().reset(**env.dataset[0])


def test_two_turns_two_verifiers_and_reward_their_mean(chat_bundle):
    with AgentEnv.local(chat_bundle, reward=mean) as env:
        talk = env.factory()
        talk.reset(**env.dataset[0])
        assert talk.end_turn(response="hello there") == "Say bye."  # the next turn's prompt
        assert talk.end_turn(response="bye") == "The episode has ended."
        assert talk.get_reward() == pytest.approx((1.0 + 0.75) / 2)
        by_step = AgentEnv(env.url, reward="parts", token=env.token)  # reward= on the client, against the server's scores
        talk = by_step.factory()
        talk.reset(**by_step.dataset[0])
        talk.end_turn(response="hello")
        talk.end_turn(response="bye!")
        assert talk.get_reward() == 1.0
        by_step.close()


def test_the_check_passes_a_good_setup_and_says_how_to_fix_a_bad_one(quiz, qwen3_tokenizer):
    import copy

    quiz.check(qwen3_tokenizer)
    plain = copy.copy(qwen3_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(CheckFailed) as failed:
        quiz.check(plain, quiz.dataset.remove_columns(["split"]))
    assert "use_tool_template(tokenizer) builds one from the model's own turns" in str(failed.value)
    assert "keep its split and index columns" in str(failed.value)


@pytest.mark.slow
def test_preflight_and_the_check_run_the_round_trip_a_built_template_passes(quiz):
    import_unsloth()  # as a notebook has: preflight checks a template only where trl can come after unsloth
    from agentenv_nb.notebook.preflight import check_tools
    from agentenv_nb.train.model.tiny import build_tokenizer
    from agentenv_nb.train.model.tool_template import use_tool_template

    mistral = build_tokenizer(family="mistral", vocab_size=700)  # [INST] turns: TRL parses no tool calls from them
    [row] = check_tools(quiz, mistral)
    assert row["status"] == "fail" and "this one is none of them" in row["detail"]
    assert row["fix"].startswith("agentenv_nb.train.model.tool_template.use_tool_template(tokenizer) builds one")
    with pytest.raises(CheckFailed, match="this one is none of them"):
        quiz.check(mistral)
    use_tool_template(mistral)
    [row] = check_tools(quiz, mistral)
    assert row["status"] == "ok" and "makes the round trip through the chat template" in row["detail"]
    quiz.check(mistral)


def test_the_check_names_tool_parameters_trl_cannot_offer():
    from agentenv_nb.client.checks import tool_problems
    from agentenv_nb.client.environment import environment_class

    tool = {"name": "book", "description": "Book a trip.", "input_schema": {"type": "object", "required": ["from"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string", "description": "Where to."}}}}
    trips = environment_class("trips", (tool,), runtime=None, rules=None)
    [problem] = tool_problems({"trips": trips})  # "to" reads back as the server describes it
    assert "tool 'book' of 'trips': parameters ['from'] aren't Python names" in problem
    assert "rename them in the env's tool" in problem


@pytest.mark.slow
def test_a_dict_factory_trains_two_bundles_mixed_in_one_dataset(chat_bundle, quiz, tiny_model, tmp_path):
    from datasets import concatenate_datasets

    with AgentEnv.local(chat_bundle, reward=mean) as chat:
        rows = concatenate_datasets([quiz.dataset.select([0]), chat.dataset.select([0])])  # one task of each
        trainer = grpo(tiny_model, tmp_path, dataset=rows, factory={**quiz.factories, **chat.factories}, steps=1,
                       per_device_train_batch_size=4,
                       reward_funcs=[read_plain_text_replies], callbacks=[quiz.metrics, chat.metrics])
        trainer.train()
    [log] = step_logs(trainer, "rewards/quiz/mean")
    for key in ("rewards/quiz/mean", "rewards/chat/mean", "scores/quiz/check/mean", "scores/chat/greets/mean",
                "scores/chat/parts/mean"):
        assert log[key] is not None, key  # each bundle's rows went to its own class


def test_gridsims_tools_are_methods_that_play_a_day(gridsim):
    from agentenv_nb.client.player import ToolFailed

    play = gridsim.factory()
    assert type(play).__name__ == "gridsim-tiny"
    play.reset(**gridsim.dataset[0])
    assert len(json.loads(play.get_prices())) == 24
    with pytest.raises(ToolFailed, match="schedule"):
        play.submit_schedule(schedule="idle")  # the server's validation error, which TRL hands the model
    assert play.submit_schedule(schedule=[0] * 24).startswith("schedule accepted")
    assert play.get_reward() == pytest.approx(0.2)  # idling all day


def play_two_days(factory_bytes: bytes, rows: list[dict], results) -> None:
    """In the spawned process: two rollouts at once, as the async trainer's loop runs them. The first plays the day's
    optimum and is scored while the second is still playing; the second then idles its day and is scored."""
    async def main():
        factory = pickle.loads(factory_bytes)
        first, second = factory(), factory()
        for environment, row in zip((first, second), rows):
            environment.reset(**row)  # on the loop, as TRL's _generate_loop calls it
        prices = json.loads(await asyncio.to_thread(first.get_prices))
        await asyncio.to_thread(first.submit_schedule, schedule=battery.optimal_schedule(prices))
        scored_first = await first.get_reward()  # the second's episode must play on
        await asyncio.to_thread(second.get_prices)
        accepted = await asyncio.to_thread(second.submit_schedule, schedule=[0] * 24)
        return type(first).__name__, scored_first, accepted, await second.get_reward()

    results.put(asyncio.run(main()))


def test_a_pickled_factory_plays_gridsim_in_a_spawned_process(gridsim):
    rows = [{k: v for k, v in row.items()} for row in gridsim.dataset.to_list()]
    spawn = multiprocessing.get_context("spawn")  # as AsyncRolloutWorker starts its child
    results = spawn.Queue()
    child = spawn.Process(target=play_two_days, args=(pickle.dumps(gridsim.factory), rows, results))
    child.start()
    try:
        name, first_reward, accepted, second_reward = results.get(timeout=120)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert name == "gridsim-tiny"  # TRL's reward column: rewards/gridsim-tiny/mean
    assert first_reward == pytest.approx(1.0)  # the optimum
    assert accepted.startswith("schedule accepted")  # the first's reward didn't end the second's episode
    assert second_reward == pytest.approx(0.2)  # idling all day


def test_the_factory_stays_trls_synchronous_class_in_its_own_process(gridsim):
    factory = gridsim.factory
    assert not inspect.iscoroutinefunction(factory.get_reward)  # GRPOTrainer calls it without awaiting
    rebuilt = pickle.loads(pickle.dumps(factory))
    assert rebuilt is not factory and inspect.iscoroutinefunction(rebuilt.get_reward)
    assert pickle.loads(pickle.dumps(factory)) is rebuilt  # one class, and one runtime, a process
    assert [n for n in vars(rebuilt) if not n.startswith("_")] == [n for n in vars(factory) if not n.startswith("_")]


def test_toolsets_each_makes_a_class_per_toolset(tmp_path):
    from agentenv_nb.tasks.gridsim import write_bundle as write_gridsim

    bundle = write_gridsim(tmp_path / "mixed", train=1, eval=1)
    (bundle / "tasks" / "quiz.json").write_text(json.dumps(one_turn_task("42")))
    (bundle / "evals" / "train.toml").write_text('tasks = ["train-0000", "quiz"]\n')
    with AgentEnv.local(bundle, sandbox="process", toolsets="each") as env:
        factory = env.factory
        assert isinstance(factory, dict) and len(factory) == 2
        by_task = dict(zip(env.dataset["task_id"], env.dataset["environment"], strict=True))
        quiz_class = factory[next(name for task, name in by_task.items() if task.endswith("/quiz"))]
        assert not hasattr(quiz_class, "get_prices") and hasattr(quiz_class, "end_turn")


@pytest.mark.slow
def test_grpo_calls_gridsims_tools_evaluates_logs_scores_and_trains_lora(gridsim, tiny_model, tmp_path):
    """The random tiny model is taught to call a tool at decode time: ``sequence_bias`` makes a rollout that
    samples ``<tool_call>`` (half of them, about) write a whole submit_schedule call of an idle day, which
    scores 0.2 where a rollout without it scores 0, so the groups' rewards differ and LoRA learns. The eval's scores
    and transcripts stay the eval's though the model is back in training mode when the rewards are read, as Unsloth's
    GRPOTrainer leaves it after generating (its ``model.for_training`` there, evaluating or not)."""
    from transformers import AutoTokenizer, TrainerCallback

    def back_in_training_mode(completions, **kwargs):  # runs before the env's get_reward: scores nothing
        trainer.model.train()
        return [None] * len(completions)

    class BackInEvalMode(TrainerCallback):  # after an eval batch, as the eval loop left it before the batch
        def on_prediction_step(self, args, state, control, model=None, **kwargs):
            model.eval()

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    gridsim.check(tokenizer)
    schedule = ", ".join(["0"] * 24)
    call = f'<tool_call>\n{{"name": "submit_schedule", "arguments": {{"schedule": [{schedule}]}}}}\n</tool_call>'
    ids = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]
    bias = [[ids[:1], 3.0]] + [[ids[:k], 50.0] for k in range(2, len(ids) + 1)]
    trainer = grpo(tiny_model, tmp_path, dataset=gridsim.dataset, eval_dataset=gridsim.dataset_for("eval"),
                   factory=gridsim.factory, steps=1, callbacks=[gridsim.metrics, BackInEvalMode()],
                   reward_funcs=[back_in_training_mode], per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=len(ids) + 30, max_tool_calling_iterations=1,
                   generation_kwargs={"sequence_bias": bias}, eval_strategy="steps", eval_steps=1,
                   per_device_eval_batch_size=2, num_generations_eval=1)
    lora = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_" in name}
    trainer.train()
    [log] = step_logs(trainer, "tools/call_frequency")
    assert log["tools/call_frequency"] > 0 and log["tools/failure_frequency"] == 0  # parsed, and run on the env
    assert log["rewards/gridsim-tiny/mean"] is not None and log["reward_std"] > 0
    assert log["scores/gridsim-tiny/schedule/mean"] == pytest.approx(log["rewards/gridsim-tiny/mean"])
    [evaluated] = step_logs(trainer, "eval_rewards/gridsim-tiny/mean")
    assert evaluated["eval_scores/gridsim-tiny/unscored"] == 0.0
    _, logged = logged_rollouts(tmp_path, step=1)
    assert [rollout["task_id"].split("/")[-1].split("-")[0] for rollout in logged] == ["train"] * 4  # the step's only
    assert any(not p.equal(lora[name]) for name, p in trainer.model.named_parameters() if "lora_" in name)
