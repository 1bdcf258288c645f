"""The longest step first: the trial step's decision from measured numbers, and the step itself run end to end on
CPU with the tiny model against a bundle served on loopback (its time only: a CPU has no card to fit)."""

import pytest

from agentenv_nb.stack import import_unsloth

import_unsloth()  # before anything imports trl, as TRL 1.15 on CPU needs
from agentenv_nb import AgentEnv  # noqa: E402
from agentenv_nb.train.grpo.trial import (Measured, check, length_problem, longest_prompt, trial_step,  # noqa: E402
                                          verdict)
from agentenv_nb.train.presets import PRESETS  # noqa: E402
from tests.conftest import one_turn_task, write_bundle  # noqa: E402
from transformers import TrainerState  # noqa: E402

SETTINGS = dict(max_steps=40, batch=8, accumulation=4, completion_length=1024)  # the "24gb" preset's shape


def test_a_step_that_fits_says_its_peak_and_the_runs_time():
    assert verdict(Measured(5.2, 19.1, 6.0), 24.0, **SETTINGS) == (
        "fits: peak 19.1 of 24.0 GB; at most about 5.2 s a step, 3.5 minutes for 40 steps")


def test_a_step_that_doesnt_fit_says_what_to_lower_and_to_what():
    # 10 GB of weights, 20 GB above them where 12.8 fit (0.95 x 24 - 10): a micro-batch of 4, not 8
    assert verdict(Measured(5.0, 30.0, 10.0), 24.0, **SETTINGS) == (
        "doesn't fit: peak 30.0 of 24.0 GB; lower per_device_train_batch_size from 8 to 4 and raise "
        "gradient_accumulation_steps from 4 to 8 (the same 32 rollouts a step, 2x the time to train them)")
    assert "from 8 to 2 and raise gradient_accumulation_steps from 4 to 16" in verdict(
        Measured(5.0, 50.0, 10.0), 24.0, **SETTINGS)  # a third fits: the next divisor of 32 down
    ran_out = verdict(Measured(5.0, 24.0, 10.0, out_of_memory=True), 24.0, **SETTINGS)
    assert ran_out.startswith("doesn't fit: ran out of memory at 24.0 of 24.0 GB; lower per_device_train_batch_size "
                              "from 8 to 4")
    one = {**SETTINGS, "batch": 1, "accumulation": 32}
    assert verdict(Measured(5.0, 30.0, 10.0), 24.0, **one) == (  # 12.8 of 20 GB fit: 0.64 x 1024, in 16s
        "doesn't fit: peak 30.0 of 24.0 GB; lower max_completion_length from 1024 to 640")


def test_a_budget_past_the_sequence_vllm_is_loaded_for_says_the_length_that_fits():
    assert length_problem(612, 1024, 4096) is None
    assert length_problem(612, 4096, 4096) == (  # vLLM would stop each rollout at 4,096 tokens in all, not 4,096 more
        "doesn't fit: the longest prompt's 612 tokens and max_completion_length 4096 exceed max_seq_length 4096, the "
        "longest sequence vLLM is loaded for; lower max_completion_length from 4096 to 3472")
    assert length_problem(4090, 512, 4096).endswith("; shorten the prompts")


@pytest.fixture(scope="module")
def short_and_long(tmp_path_factory):
    long = one_turn_task("42")
    long[1]["prompt"] += " Take your time." * 30  # the split's longest prompt
    bundle = write_bundle(tmp_path_factory.mktemp("trial") / "quiz", {"short": one_turn_task("41"), "long": long},
                          {"train": ["short", "long"], "eval": ["short"]})
    with AgentEnv.local(bundle, max_concurrent_envs=4, plain_text_replies=True) as env:  # one step's rollouts
        yield env


@pytest.mark.slow
def test_the_trial_step_runs_the_worst_case_on_cpu_and_trains_nothing(short_and_long, tiny_model, tmp_path,
                                                                      monkeypatch):
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading

    model, tokenizer = loading.load_model(tiny_model, "cpu-tiny")
    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path), max_steps=30, max_completion_length=32,
                                 per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
                                 steps_per_generation=1)
    longest, prompt_tokens = longest_prompt(short_and_long, tokenizer, config)
    assert short_and_long.dataset[longest]["task_id"].endswith("long") and prompt_tokens > 30  # " Take your time." x 30
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    monkeypatch.setenv("AGENTENV_NB_LIBRARY_LOG", str(tmp_path.parent / "trial.log"))
    measured = trial_step(model, tokenizer, config, short_and_long, longest)
    logged = (tmp_path.parent / "trial.log").read_text()
    assert logged.count("'step_time'") == 2 and "it/s" not in logged  # each step's log a line, no progress bar
    assert measured.completion_tokens == 32  # every rollout written to the budget
    assert not measured.out_of_memory and measured.seconds > 0 and measured.peak_gb == 0  # no GPU here
    assert all(p.equal(weights[name]) for name, p in model.named_parameters())  # the step trained nothing
    assert check(model, tokenizer, config, short_and_long, PRESETS["cpu-tiny"]) == (
        "trial step skipped: cpu-tiny is a CPU preset (it measures a GPU's memory)")
    line = check(model, tokenizer, config, short_and_long, PRESETS["cpu-tiny"], force=True)
    assert line.startswith("trial step on the CPU: at most about ") and line.endswith(" for 30 steps")
    assert not list(tmp_path.iterdir())  # nothing written into the run's own folder
    logs = {"loss": 0.0}
    short_and_long.metrics.on_log(None, TrainerState(), None, logs=logs)
    assert logs == {"loss": 0.0}  # the trial's scores are no step's: the run's first log has its own only
