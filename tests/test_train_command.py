"""``python -m agentenv_nb.train``, notebook 03's run as a command: ``--help``, usage errors in one line, the env
capacity every rank needs, and the tiny config end to end: two processes on the CPU (gloo, as ``torchrun`` starts
them on GPUs) training a step once, then one process resuming their run as the notebook resumes. ``python -m
agentenv_nb.train sft``, notebook 02's warm start as a command, on the tiny model. Each stage's notebook holds its
parameters cell to its run and its command.
"""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentenv_nb.train.grpo.command import PROG


TRAIN = [sys.executable, "-m", "agentenv_nb.train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
            "agentenv_nb.train"]


def run(command: list, tmp_path, timeout: float = 600, **environ: str) -> subprocess.CompletedProcess:
    """The command as a user starts it, with the env framework's store of episodes kept in ``tmp_path``, and
    ``environ`` set."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TRL_EXPERIMENTAL_SILENCE": "1",
           "HF_HOME": str(tmp_path / "hf"), **environ}  # no Hugging Face login but HF_TOKEN
    env.pop("HF_TOKEN", None)
    # Unsloth, imported by earlier tests in this process, sets it, and huggingface_hub warns about it on stderr
    env.pop("HF_HUB_ENABLE_HF_TRANSFER", None)
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, env=env, timeout=timeout)


def failure(done: subprocess.CompletedProcess) -> str:
    """What a failed command wrote: the lines naming an error, every rank's (under torchrun, the first rank to fail
    says why, and the launcher's summary after it would push that out of a tail), then the tail."""
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return "\n".join(errors[-20:]) + "\n...\n" + done.stderr[-1500:]


@pytest.mark.slow  # the command in fresh interpreters
def test_help_and_usage_errors_in_one_line(tmp_path):
    shown = run([*TRAIN, "--help"], tmp_path)
    assert shown.returncode == 0 and "torchrun --nproc_per_node N -m agentenv_nb.train" in shown.stdout
    for option in ("--bundle", "--run-dir", "--warm-start", "--preset", "--sandbox", "--max-steps", "--save-steps",
                   "--max-concurrent-envs", "--server-processes", "--env-url", "--report-to", "--gguf", "--push-to-hub",
                   "--trainer", "--learning-rate", "--temperature", "--lora-rank", "--rollouts-a-step",
                   "--num-generations"):
        assert option in shown.stdout
    for args, says in [(["--max-steps", "0"], "--max-steps: '0' is not a whole number of at least 1"),
                       (["--preset", "8gb"], "argument --preset: invalid choice: '8gb'"),
                       (["--run-dir", tmp_path], f"no warm start at {tmp_path}/sft/merged: run notebook 02"),
                       (["--warm-start", tmp_path, "--preset", "cpu-tiny", "--bundle", "no-such-bundle"],
                        "no bundle 'no-such-bundle'"),
                       (["--warm-start", tmp_path, "--preset", "24gb"],
                        "the '24gb' preset trains on a GPU and none is visible here"),
                       (["--warm-start", tmp_path, "--preset", "24gb", "--set", "fsdp=full_shard"],
                        "FSDP can't train the '24gb' preset"),
                       (["--warm-start", tmp_path, "--preset", "cpu-tiny", "--trainer", "async"],
                        "the async trainer generates on the model's own vLLM, and the 'cpu-tiny' preset generates "
                        "without it: pick --trainer 'grpo', or a preset that generates on vLLM"),
                       (["--warm-start", tmp_path, "--preset", "cpu-tiny", "--rollouts-a-step", "6"],
                        "6 rollouts a step don't make whole groups of 4 rollouts a task (--num-generations): pass "
                        "--rollouts-a-step a multiple of it"),
                       (["--max-concurrent-envs", "8"], "--max-concurrent-envs is for servers elsewhere (--env-url)"),
                       (["--trainer", "sync"], "argument --trainer: invalid choice: 'sync'"),
                       (["--report-to", "mlflow"], "argument --report-to: invalid choice: 'mlflow'"),
                       (["--push-to-hub", "you/model"], "--push-to-hub 'you/model' needs a Hugging Face token with "
                                                        "write access: set HF_TOKEN"),
                       (["--push-to-hub", "not a repo"], "--push-to-hub 'not a repo' is not a Hub repo id")]:
        failed = run([*TRAIN, *args], tmp_path)
        assert failed.returncode == 2 and failed.stdout == "", failed.stdout
        assert failed.stderr.count("\n") == 1 and says in failed.stderr and "Traceback" not in failed.stderr


@pytest.mark.slow  # the command in fresh interpreters
def test_a_bad_setting_is_said_in_one_line_before_anything_loads_on_every_path(tmp_path):
    """Serving here, playing an env server elsewhere (--env-url), or a rank other than 0: each reads the settings
    first, not after Unsloth's import, where a bad one surfaced as a traceback."""
    for args, rank in [(["--env-url", "http://127.0.0.1:9"], "0"), ([], "0"), ([], "1")]:
        failed = run([*TRAIN, "--warm-start", tmp_path, "--preset", "cpu-tiny", *args], tmp_path, timeout=120,
                     AGENTENV_NB_CALL_TIMEOUT="abc", RANK=rank)
        assert failed.returncode == 2 and failed.stdout == "", failed.stdout
        assert failed.stderr.count("\n") == 1 and "AGENTENV_NB_CALL_TIMEOUT='abc' isn't a number" in failed.stderr, (
            args, rank, failed.stderr[-2000:])


@pytest.mark.slow  # two launches of two fresh processes
def test_a_launch_that_cant_train_is_refused_by_each_rank_in_one_line(tmp_path):
    """The docs' torchrun and accelerate launch command lines reach the command on each rank, which refuses what
    can't train before anything slow: here, with no GPU visible, the "24gb" preset on torchrun's two processes, and
    FSDP with the preset's vLLM under ``accelerate launch --use_fsdp``. The launcher then reports its failed ranks its
    own way."""
    accelerate = [Path(sys.executable).with_name("accelerate"), "launch", "--num_processes", "2", "--use_fsdp",
                  "-m", "agentenv_nb.train"]
    for launcher, says in [(TORCHRUN, "the '24gb' preset trains on a GPU and none is visible here"),
                           (accelerate, "FSDP can't train the '24gb' preset")]:
        failed = run([*launcher, "--warm-start", tmp_path, "--preset", "24gb"], tmp_path, timeout=300,
                     CUDA_VISIBLE_DEVICES="")  # no GPU, wherever the test runs
        assert failed.returncode != 0
        assert "Unsloth Zoo will now patch" not in failed.stdout + failed.stderr  # refused before Unsloth loads
        said = [re.fullmatch(rf"{re.escape(PROG)}: error(?: \(rank 1\))?: (.*)", line)
                for line in failed.stderr.splitlines() if line.startswith(PROG)]
        assert 1 <= len(said) <= 2 and len({m.group(0) for m in said}) == len(said)  # each rank's line, once
        assert {m.group(1) for m in said} == {said[0].group(1)} and says in said[0].group(1), failed.stderr[-2000:]
        assert "agentenv_nb/" not in failed.stderr  # no traceback of the kit's


NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
# Each stage's notebook, its run and its command, which the notebook's parameters cell is held to
STAGES = {"02_sft_warm_start": ("agentenv_nb.train.warm_start.run", "SFTRun", "agentenv_nb.train.warm_start.command"),
          "03_grpo": ("agentenv_nb.train.grpo.run", "GRPORun", "agentenv_nb.train.grpo.command")}


def parameters_cell(notebook: str = "03_grpo") -> str:
    cells = [cell for cell in json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
             if cell["cell_type"] == "code"]
    return "".join(cells[1]["source"])  # the set-up cell, then the parameters cell (test_notebooks_clean)


@pytest.mark.parametrize("notebook", STAGES)
def test_a_stage_s_parameters_cell_lists_its_command_s_parameters_with_their_defaults(notebook, monkeypatch):
    """Each of the run's parameters a plain assignment with its default and a comment, in the run's groups and order,
    and nothing else, so the notebook, the command's options and the tiny run can't drift apart."""
    import importlib

    module, name, command_module = STAGES[notebook]
    run_class, command = getattr(importlib.import_module(module), name), importlib.import_module(command_module)
    for parameter in run_class().parameters():
        monkeypatch.delenv(f"AGENTENV_NB_{parameter}", raising=False)
    source = parameters_cell(notebook)
    assignments = [node for node in ast.parse(source).body if isinstance(node, ast.Assign)]
    assigned = [target.id for node in assignments for target in node.targets]
    assert assigned == list(run_class().parameters())  # every one, in the run's order, and no other
    lines = source.splitlines()
    assert all("  # " in lines[node.lineno - 1] for node in assignments), "a comment on each parameter's line"
    heading = "# Parameters that control "  # each group's, in the cell as in the command's --help
    assert [line.removeprefix(heading) for line in lines if line.startswith(heading)] == list(run_class.groups())
    for words, names in run_class.groups().items():
        assert lines[lines.index(heading + words) + 1].startswith(f"{names[0].upper()} = "), words
    shown = command.options().parser.format_help()
    assert [shown.index(f"Parameters that control {words}:") for words in run_class.groups()] == sorted(
        shown.index(f"Parameters that control {words}:") for words in run_class.groups())
    cell = {}
    exec(source, cell)
    assert {name: cell[name] for name in assigned} == run_class().parameters()
    assert run_class.of(cell) == run_class()
    args = vars(command.options().parser.parse_args([]))
    assert {name: args[name] for name in run_class.command_options()} == {
        name: getattr(run_class(), name) for name in run_class.command_options()}


def test_notebook_03_s_parameters_take_the_environment_each_as_its_type(monkeypatch, capsys):
    """``AGENTENV_NB_<NAME>`` overrides each of notebook 03's parameters as its type; the notebook's own are those of
    "Try it"."""
    from agentenv_nb.settings import SettingError
    from agentenv_nb.train.grpo.run import GRPORun

    for name in GRPORun().parameters():
        monkeypatch.delenv(f"AGENTENV_NB_{name}", raising=False)
    source = parameters_cell()
    assert set(vars(GRPORun())) - set(GRPORun.command_options()) == {"try_day", "try_prompt"}  # the notebook's own

    monkeypatch.setenv("AGENTENV_NB_MAX_STEPS", "3")
    monkeypatch.setenv("AGENTENV_NB_LEARNING_RATE", "1e-4")
    monkeypatch.setenv("AGENTENV_NB_PRESET", "16bit")
    exec(source, cell := {})
    assert GRPORun.of(cell) == GRPORun(max_steps=3, learning_rate=1e-4, preset="16bit")  # each as its type
    assert "MAX_STEPS = 3  (from AGENTENV_NB_MAX_STEPS)" in capsys.readouterr().out
    monkeypatch.setenv("AGENTENV_NB_MAX_STEPS", "three")
    with pytest.raises(SettingError) as refused:  # settings' parser: one line, shown alone in a notebook
        exec(source, {})
    assert refused.value._render_traceback_() == [
        "AGENTENV_NB_MAX_STEPS='three' isn't a whole number; set it to one, or unset it (the notebook's MAX_STEPS)"]


def test_the_run_s_trainer_settings_reach_its_config_and_its_lora(tmp_path):
    from agentenv_nb.train import presets
    from agentenv_nb.train.grpo.run import GRPORun, run_config, run_preset

    run = GRPORun(preset="cpu-tiny", run_dir=str(tmp_path), learning_rate=1e-3, temperature=0.5, lora_rank=8,
                  rollouts_a_step=16, num_generations=8)
    preset = run_preset(run)
    assert presets.peft_kwargs(preset)["r"] == 8 and presets.peft_kwargs(preset)["lora_alpha"] == 16  # 2r, as r32/64
    assert presets.model_kwargs(preset, "tiny")["max_lora_rank"] == 8
    config = run_config(run, preset, None)
    assert (config.learning_rate, config.temperature, config.num_generations) == (1e-3, 0.5, 8)
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 16
    assert config.output_dir == f"{tmp_path}/grpo"
    assert run_config(GRPORun(preset="cpu-tiny", run_dir=str(tmp_path)), presets.named("cpu-tiny"),
                      None).learning_rate == presets.named("cpu-tiny").learning_rate  # unset: the preset's
    # the command's --set settings size the run as they configure it: vLLM's weights and memory are chosen from the
    # preset (choices.vllm_weights counts its rollouts' KV cache), so a completion budget set there is vLLM's too
    planted = {"max_completion_length": 4096, "per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
               "report_to": "none"}
    sized = run_preset(GRPORun(preset="24gb", rollouts_a_step=16), settings=planted)
    assert (sized.max_completion_length, sized.per_device_train_batch_size, sized.gradient_accumulation_steps) == (
        4096, 32, 1)


def test_one_function_sizes_the_sessions_a_run_opens(tmp_path):
    from agentenv_nb.train import presets
    from agentenv_nb.train.sessions import capacity_problem, sessions_needed

    config = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path))
    assert sessions_needed(config) == 8  # a step's 2 x 4 rollouts; an eval batch of 4 reuses them
    assert capacity_problem(config, 8) is None
    assert "serve with --max-concurrent-envs 8 or more" in capacity_problem(config, 7)
    big = presets.grpo_config("24gb", output_dir=str(tmp_path))
    assert sessions_needed(big) == 32  # 32 rollouts a step (generated 16 at a time without vLLM), eval batches of 32
    assert sessions_needed(big, environments=2) == 64  # TRL pools environments per class
    tiny = presets.grpo_config("cpu-tiny", output_dir=str(tmp_path), per_device_eval_batch_size=16)
    assert sessions_needed(tiny) == 16  # an eval batch larger than a step's rollouts
    assert sessions_needed(tiny, beside=1) == 17  # a player beside the trainer's, as notebook 03's transcript

    from agentenv_nb.train.grpo.run import GRPORun, greedy_eval_sessions

    # notebook 03 and the command reserve the same room for the greedy eval after training: an eval batch at most
    assert greedy_eval_sessions(GRPORun(eval_days=50), big) == 32
    assert greedy_eval_sessions(GRPORun(eval_days=8), big) == 8
    assert greedy_eval_sessions(GRPORun(eval_days=0), big) == 1  # "Try it"'s player


@pytest.mark.slow
def test_two_processes_train_once_then_one_resumes(tmp_path):
    import pandas as pd
    from safetensors.torch import load_file

    from agentenv_nb.tasks import gridsim
    from agentenv_nb.train.model.tiny import build_tiny_model

    bundle = gridsim.write_bundle(tmp_path / "gridsim-tiny", train=4, eval=2)
    tiny = build_tiny_model(tmp_path / "tiny", corpus_texts=[gridsim.generate.SYSTEM_PROMPT])
    run_dir, grpo = tmp_path / "run", tmp_path / "run" / "grpo"
    tiny_run = ["--bundle", bundle, "--run-dir", run_dir, "--warm-start", tiny, "--preset", "cpu-tiny",
                "--sandbox", "process", "--server-processes", "0", "--save-steps", "1", "--lora-rank", "4",
                "--max-new-tokens", "32", "--set", "max_completion_length=64"]  # the random model's text only costs time

    two = run([*TORCHRUN, *tiny_run, "--max-steps", "1"], tmp_path)
    assert two.returncode == 0, failure(two)
    live = [line for line in two.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[1].split()[0] for line in live if " | " in line] == ["eval", "loss", "eval", "run"]
    assert two.stdout.count("trained to step 1") == 2  # rank 0 alone speaks: fit's line and the command's
    assert f"2 process(es) trained to step 1; checkpoints and logs in {grpo}" in two.stdout
    assert two.stdout.count("greedy eval on 2 eval tasks: reward ") == 1  # rank 0's, as notebook 03's
    greedy = pd.read_csv(run_dir / "greedy-evals.csv", index_col=0)
    assert list(greedy) == ["after GRPO"] and greedy.loc["tool_calls", "after GRPO"] >= 0
    saved = sorted(path.name for path in (grpo / "checkpoint-1").iterdir())
    assert saved.count("adapter_model.safetensors") == 1 and {"rng_state_0.pth", "rng_state_1.pth"} <= set(saved)
    logs = json.loads((grpo / "trainer_state.json").read_text())["log_history"]
    assert [log["step"] for log in logs if "loss" in log] == [1]  # the ranks' rewards gathered into one log
    assert [log["step"] for log in logs if "eval_reward" in log] == [0, 1]
    assert {"rewards/gridsim-tiny/mean", "tools/call_frequency", "scores/gridsim-tiny/unscored"} <= set(logs[1])

    one = run([*TRAIN, *tiny_run, "--max-steps", "2"], tmp_path)
    assert one.returncode == 0, failure(one)
    assert "resumed from checkpoint 1, step 1 of 2" in one.stdout
    assert "{'loss'" not in one.stdout + one.stderr  # transformers' console bar and its metrics: the library log's
    logs = json.loads((grpo / "trainer_state.json").read_text())["log_history"]
    assert [log["step"] for log in logs if "loss" in log] == [1, 2]  # step 1 kept from the checkpoint, not redone
    evals = [log["step"] for log in logs if "eval_reward" in log]
    assert evals[:2] == [0, 1] and evals[-1] == 2
    assert sorted(path.name for path in grpo.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert "GGUF skipped: Unsloth's exporter needs a built llama.cpp" in one.stdout  # none is built here
    assert "pass --build-llama-cpp" in one.stdout and "BUILD_LLAMA_CPP" not in one.stdout  # in the command's words
    trained = load_file(grpo / "checkpoint-2" / "adapter_model.safetensors")
    exported = load_file(run_dir / "trained" / "adapter" / "adapter_model.safetensors")
    assert exported.keys() == trained.keys() and all(exported[k].equal(trained[k]) for k in trained)
    assert json.loads((run_dir / "trained" / "adapter" / "adapter_config.json").read_text())["r"] == 4  # --lora-rank
    assert (run_dir / "trained" / "merged" / "model.safetensors").is_file()


@pytest.mark.slow  # the command in a fresh interpreter, and notebook 02's steps on the tiny model
def test_the_sft_command_runs_notebook_02_s_steps_and_saves_the_warm_start_grpo_trains_from(tmp_path):
    import pandas as pd

    from agentenv_nb.tasks import gridsim
    from agentenv_nb.train.earlier_steps import warm_start_problem

    for args, says in [(["--preset", "8gb"], "argument --preset: invalid choice: '8gb'"),
                       (["--preset", "cpu-tiny", "--bundle", "no-such-bundle"], "no bundle 'no-such-bundle'")]:
        failed = run([*TRAIN, "sft", *args], tmp_path)
        assert failed.returncode == 2 and failed.stdout == "", failed.stdout
        assert failed.stderr.count("\n") == 1 and says in failed.stderr and "Traceback" not in failed.stderr

    bundle = gridsim.write_bundle(tmp_path / "gridsim-tiny", train=4, eval=2)
    run_dir = tmp_path / "run"
    done = run([*TRAIN, "sft", "--bundle", bundle, "--run-dir", run_dir, "--model", "tiny", "--preset", "cpu-tiny",
                "--sandbox", "process", "--server-processes", "0", "--eval-days", "2", "--max-new-tokens", "32",
                "--distill-steps", "1", "--sft-steps", "3", "--set", "max_steps=2"], tmp_path)
    assert done.returncode == 0, failure(done)
    assert "warm start from expert: GridSim's task adapter has an expert: 4 of its 4 episodes scored 1.0" in done.stdout
    assert "trained to step 2 of 2" in done.stdout  # --set over --sft-steps, over the preset's 200 steps
    assert "warning: the model called a tool in 0% of the eval tasks: give SFT more demonstrations or more steps " \
           "(--sft-steps)" in done.stdout  # 2 steps teach the random model nothing; said in the command's words
    assert "round 1: 8 train rollouts scored" in done.stdout  # DISTILL_ROUNDS' default: one round, 2 samples a task
    assert list(pd.read_csv(run_dir / "greedy-evals.csv", index_col=0)) == ["before SFT", "after SFT"]
    assert (run_dir / "sft" / "merged" / "config.json").is_file() and (run_dir / "distilled" / "merged").is_dir()
    assert warm_start_problem(run_dir) is None  # the GRPO command finds the warm start it trains from
