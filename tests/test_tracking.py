"""A GRPO run's metrics reach TensorBoard as TRL logs them, the task's scores included: the event files transformers'
TensorBoard callback writes are read back with TensorBoard's own reader, tag by tag and step by step."""

import pytest

from agentenv_nb import AgentEnv
from agentenv_nb.client.environment import read_plain_text_replies
from agentenv_nb.train.tracking import report_to_problem, track

from .conftest import grpo


def test_a_report_to_that_cannot_log_says_what_to_do():
    assert report_to_problem("none") is None and report_to_problem("tensorboard") is None
    assert report_to_problem("mlflow") == "REPORT_TO='mlflow' is not one of 'none', 'tensorboard', 'trackio', 'wandb'"
    with pytest.raises(ValueError, match="REPORT_TO='mlflow' is not one of"):
        track(None, "mlflow")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["fit", "config"])  # notebook 03 passes REPORT_TO to fit; the command, its config
def test_reward_and_every_score_reach_tensorboard_by_step(quiz_bundle, tiny_model, tmp_path, where):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentenv_nb.train.fit import fit

    with AgentEnv.local(quiz_bundle, max_concurrent_envs=8) as env:
        trainer = grpo(tiny_model, tmp_path / "grpo", dataset=env.dataset, eval_dataset=env.dataset_for("eval"),
                       factory=env.factory, steps=2, reward_funcs=[read_plain_text_replies], callbacks=[env.metrics],
                       eval_strategy="steps", eval_steps=2, eval_on_start=True, per_device_eval_batch_size=1,
                       num_generations_eval=1, report_to="tensorboard" if where == "config" else "none")
        fit(trainer, report_to="tensorboard" if where == "fit" else None)
    [run] = (tmp_path / "grpo" / "runs").iterdir()
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    logs = trainer.state.log_history
    for tag, key, steps in [("train/reward", "reward", [1, 2]),
                            ("train/scores/quiz/check/mean", "scores/quiz/check/mean", [1, 2]),
                            ("train/scores/quiz/unscored", "scores/quiz/unscored", [1, 2]),
                            ("eval/reward", "eval_reward", [0, 2]),
                            ("eval/scores/quiz/check/mean", "eval_scores/quiz/check/mean", [0, 2])]:
        assert sorted(scalars.get(tag, {})) == steps, (tag, sorted(scalars))
        logged = {log["step"]: log[key] for log in logs if key in log}
        assert scalars[tag] == pytest.approx(logged), tag
