"""A run's health in words: each condition provoked in real GRPO steps of the tiny model on a bundle served on
loopback (no reward spread, clipped completions, a failing tool, unscored rollouts), or, for the trends a few CPU steps
can't make (eval falling, lengths drifting, tools dropped, a reward above GridSim's optimum), TRL-shaped logs through
transformers' own callback handler; each line said once with its advice, and none in a healthy run."""

import json
import logging

import pytest

from agentenv_nb.stack import import_unsloth

import_unsloth()  # before anything imports trl, as TRL 1.15 on CPU needs
from agentenv_nb.client.environment import read_plain_text_replies  # noqa: E402
from agentenv_nb.train.health import RULES, HealthCheck  # noqa: E402
from tests.conftest import grpo  # noqa: E402
from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.trainer_callback import CallbackHandler  # noqa: E402

ADVICE = {rule.name: rule.advice for rule in RULES}


def said(health: HealthCheck, rule: str) -> list[str]:
    return [line for line in health.said if f": {rule}: " in line]


def assert_said_once(health: HealthCheck, rule: str) -> str:
    [line] = said(health, rule)
    advice = ADVICE[rule]
    assert f"{advice[0].upper()}{advice[1:]}." in line
    return line


def train(quiz, tiny_model, out, rows, **config):
    health = HealthCheck(scores=quiz.metrics)
    trainer = grpo(tiny_model, out, dataset=rows, factory=quiz.factory, steps=2,
                   reward_funcs=[read_plain_text_replies], callbacks=[quiz.metrics, health], **config)
    trainer.train()
    return trainer, health


def end_early(tokenizer, weight: float) -> list:
    """A sequence bias that makes the random tiny model end its reply within a few tokens, as a trained one does."""
    return [[[tokenizer.eos_token_id], weight]]


@pytest.mark.slow
def test_a_healthy_run_says_nothing(quiz, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    trainer, health = train(quiz, tiny_model, tmp_path, quiz.dataset_for("all").select([0, 1, 2] * 3),
                            per_device_train_batch_size=8, num_generations=4, max_completion_length=48,
                            generation_kwargs={"sequence_bias": end_early(tokenizer, 4.0)})
    logs = [log for log in trainer.state.log_history if "frac_reward_zero_std" in log]
    assert len(logs) == 2 and all(log["scores/quiz/unscored"] == 0 for log in logs)
    assert health.said == [] and not (tmp_path / "health.jsonl").exists()


@pytest.mark.slow
def test_no_spread_clipping_and_unscored_rollouts_are_each_said_once(quiz, tiny_model, tmp_path, caplog):
    """Temperature near 0 makes a group's rollouts alike, a budget of 4 tokens cuts them, and rows of a task the
    split hasn't leave their episodes unscored."""
    rows = quiz.dataset_for("all").select([0, 1, 2, 0, 1, 2, 0, 1]).map(lambda row, i: {"index": 9} if i == 7 else {},
                                                               with_indices=True)  # one group of 8 unscored
    with caplog.at_level(logging.WARNING):
        trainer, health = train(quiz, tiny_model, tmp_path, rows, per_device_train_batch_size=8, temperature=0.01,
                                max_completion_length=4)
    assert "of groups scored all their rollouts alike" in assert_said_once(health, "no reward spread")
    assert "100% of completions hit max_completion_length" in assert_said_once(health, "completions clipped")
    assert "25% of rollouts were left unscored" in assert_said_once(health, "unscored rollouts")
    assert len(health.said) == 3, health.said  # each once, over two steps; nothing else
    logged = [json.loads(line) for line in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert [entry["line"] for entry in logged] == health.said
    assert all(entry["line"].startswith(f"health, step {entry['step']}: {entry['rule']}: ") for entry in logged)


@pytest.fixture(scope="module")
def calling_run(quiz, tiny_model, tmp_path_factory):
    """Two steps in which the tiny model is made to call end_turn at every turn: the second call, on an ended
    episode, fails."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    call = '<tool_call>\n{"name": "end_turn", "arguments": {"response": "41"}}\n</tool_call>'
    ids = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]
    bias = [[ids[:1], 10.0]] + [[ids[:k], 50.0] for k in range(2, len(ids) + 1)]
    out = tmp_path_factory.mktemp("calling")
    trainer, health = train(quiz, tiny_model, out, quiz.dataset_for("all").select([0, 1, 2, 0]),
                            per_device_train_batch_size=4, max_completion_length=6 * len(ids),
                            max_tool_calling_iterations=2, generation_kwargs={"sequence_bias": bias})
    return trainer, health, out


@pytest.mark.slow
def test_a_failing_tool_is_said_once_with_the_tool_and_its_error(calling_run):
    trainer, health, _ = calling_run
    line = assert_said_once(health, "tool failures")
    assert "most often end_turn: the episode has ended" in line
    assert trainer.state.log_history[0]["tools/failure_frequency"] > 0.2


@pytest.mark.slow
def test_a_steps_best_and_worst_rollouts_show_as_transcripts_of_its_tool_calls_and_score(calling_run, capsys):
    from agentenv_nb.notebook.transcript import best_and_worst, logged_rollouts
    from agentenv_nb.stops import Stop

    trainer, _, out = calling_run
    step, rollouts = logged_rollouts(out)
    assert step == 2 and len(rollouts) == 4  # the last step's: a batch of 4
    log = next(log for log in trainer.state.log_history if log.get("step") == 1 and "reward" in log)
    _, first = logged_rollouts(out, step=1)
    assert sum(r["reward"] for r in first) / len(first) == pytest.approx(log["reward"])
    tables = best_and_worst(out, step=1)
    assert len(tables) == 2 and capsys.readouterr().out.startswith("step 1: 4 rollouts; the best scored ")
    best = tables[0].data
    assert best["who"].tolist()[:2] == ["system", "user"] and "Say 4" in best["message"][1]
    assert 'end_turn(response="41")' in best["message"].tolist()
    assert {"The episode has ended.", "error: the episode has ended"} <= set(best["message"])  # results, failed too
    assert "reward" in tables[0].caption and "quiz/" in tables[0].caption
    with pytest.raises(Stop, match="no rollouts logged at step 7; the steps logged: 1, 2"):
        logged_rollouts(out, step=7)


def drive(health: HealthCheck, logs: list[dict], folder) -> None:
    """Feed TRL-shaped logs, a step each, through transformers' CallbackHandler, the run's folder ``folder``."""
    handler = CallbackHandler([health], None, None, None, None)
    args, state = TrainingArguments(output_dir=str(folder), report_to="none"), TrainerState()
    for step, log in enumerate(logs, start=1):
        state.global_step = step
        handler.on_log(args, state, TrainerControl(), dict(log))


HEALTHY = {"loss": 0.01, "reward": 0.5, "frac_reward_zero_std": 0.25, "completions/clipped_ratio": 0.0,
           "completions/mean_length": 300.0, "tools/call_frequency": 2.0, "tools/failure_frequency": 0.0,
           "scores/gridsim-v1/unscored": 0.0}


@pytest.mark.parametrize("rule, logs, words", [
    ("reward up, eval down", [{"eval_reward": 0.6}, HEALTHY, {**HEALTHY, "reward": 0.7}, {"eval_reward": 0.5},
                              {**HEALTHY, "reward": 0.8}, {"eval_reward": 0.4}], "train reward rose"),
    ("eval reward fell", [{"eval_reward": 0.301}, HEALTHY, {**HEALTHY, "reward": 0.1}, {**HEALTHY, "reward": 0.0},
                          {"eval_reward": 0.0}], "lost 100% of what it was at the start"),  # the tiny demo's fall
    ("length drift", [HEALTHY, {**HEALTHY, "completions/mean_length": 500.0},
                      {**HEALTHY, "completions/mean_length": 700.0}, {**HEALTHY, "completions/mean_length": 800}],
     "2.3x longer or shorter"),
    ("tools dropped", [HEALTHY, {**HEALTHY, "tools/call_frequency": 0.5}, {**HEALTHY, "tools/call_frequency": 0.0},
                       {**HEALTHY, "tools/call_frequency": 0.0}], "calls 0.00 tools a rollout"),
    ("above the optimum", [HEALTHY, {**HEALTHY, "reward": 1.2}, {**HEALTHY, "reward": 1.3}],
     "above the task's known optimum 1.000"),
], ids=["eval", "eval fell", "length", "tools", "optimum"])
def test_trends_are_said_once_when_crossed(rule, logs, words, capsys, tmp_path):
    health = HealthCheck(optimum=1.0)  # GridSim's: its exact optimum scores 1.0 on every day
    drive(health, logs, tmp_path)
    line = assert_said_once(health, rule)
    assert words in line and len(health.said) == 1
    assert capsys.readouterr().out.splitlines() == [line]  # printed outside a notebook


def test_healthy_logs_and_a_run_without_an_optimum_say_nothing(tmp_path):
    health = HealthCheck()
    drive(health, [HEALTHY, {"eval_reward": 0.5}, {**HEALTHY, "reward": 1.5}, {"eval_reward": 0.55}, HEALTHY,
                   {"eval_reward": 0.3}], tmp_path)  # a fall of 40%: a small sampled eval swings that far
    assert health.said == []


def test_an_eval_left_unscored_is_said_with_why(tmp_path):
    """A slow model's eval whose env sessions all closed idle, as a CPU run of Gemma 3 270M's did: the eval's
    unscored rollouts are said, with the error that left them so and the limit to raise."""
    from types import SimpleNamespace

    from agentenv_nb.client.metrics import ScoreLog

    scores = ScoreLog()
    health = HealthCheck(scores=scores)
    handler = CallbackHandler([scores, health], SimpleNamespace(training=False), None, None, None)  # an eval's mode
    args, state, control = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerState(), \
        TrainerControl()
    handler.on_init_end(args, state, control)
    idle = ("get_prices: the connection to ws://127.0.0.1:38301/ws closed (received 4408 (private use) idle for "
            "600 s (AGENTENV_NB_IDLE_TIMEOUT))")
    for _ in range(8):
        scores.record("gridsim-tiny", None, rollout={"task_id": "eval-0001", "messages": [], "reward": None,
                                                     "scores": {}, "error": idle})
    state.global_step = 4
    handler.on_log(args, state, control, {"eval_reward": float("nan"), "eval_loss": 0.0})
    line = assert_said_once(health, "unscored rollouts")
    assert "100% of rollouts were left unscored, most often: get_prices: the connection" in line
    assert "raise AGENTENV_NB_IDLE_TIMEOUT" in line
