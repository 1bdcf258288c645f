"""The live callback and the eval curve, driven by transformers' own Trainer and callback handler on CPU."""

import json
import math
from pathlib import Path

import matplotlib
import nbformat
import pandas as pd
import pytest
import torch

from agentenv_nb.notebook.curves import eval_curve, eval_table, find_trainer_state, plot_eval_curve, save_eval_curve
from agentenv_nb.tasks.gridsim.adapter import GridSimAdapter
from agentenv_nb.train.live import ConsoleLivePlot, NotebookLivePlot, format_row, live_plot
from nbclient import NotebookClient
# transformers after agentenv_nb.train.live, which hides a broken torchvision wheel that would break these imports
from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

matplotlib.use("Agg")

# Log dicts as TRL 1.15's GRPOTrainer.log writes them (keys from trl/trainer/grpo_trainer.py), step 12 from the recipe page,
# with the scores agentenv_nb.client.metrics.ScoreLog adds.
TRAIN_12 = {"loss": 0.0523, "grad_norm": 0.0498, "learning_rate": 1.2e-5, "num_tokens": 81920.0,
            "completions/mean_length": 681.2, "completions/clipped_ratio": 0.0, "tools/call_frequency": 2.0,
            "tools/failure_frequency": 0.0, "rewards/gridsim-v1/mean": 0.6434, "rewards/gridsim-v1/std": 0.3533,
            "reward": 0.6434, "reward_std": 0.3533, "frac_reward_zero_std": 0.25, "entropy": 0.41,
            "clip_ratio/region_mean": 0.0, "step_time": 101.8, "scores/gridsim-v1/grade/mean": 0.61,
            "scores/gridsim-v1/unscored": 0.0, "epoch": 0.05}
EVAL_0 = {"eval_loss": 0.0, "eval_runtime": 600.0, "eval_reward": 0.551, "eval_reward_std": 0.3,
          "eval_rewards/gridsim-v1/mean": 0.551, "eval_tools/call_frequency": 2.0,
          "eval_scores/gridsim-v1/grade/mean": 0.55, "epoch": 0.0}
# Other names and a CPU run: only `rewards/<EnvClass>/mean`, no step_time, an all-NaN metric logged as None.
TRAIN_CPU = {"loss": 0.01, "rewards/GridSimEnv/mean": 0.4, "rewards/GridSimEnv/std": 0.1,
             "tools/failure_frequency": None, "epoch": 0.1}
EVAL_OLD = {"eval_rewards/GridSimEnv/mean": 0.3, "epoch": 0.1}


def drive(callback, events):
    """Feed ``(step, logs)`` events through transformers' CallbackHandler, timing a step before each train log."""
    handler = CallbackHandler([DefaultFlowCallback(), callback], None, None, None, None)
    args, state, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(), TrainerControl()
    for step, logs in events:
        state.global_step = step
        if "loss" in logs:
            handler.on_step_begin(args, state, control)
            handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, dict(logs))
    handler.on_train_end(args, state, control)


EVENTS = [(0, EVAL_0), (12, TRAIN_12), (13, TRAIN_CPU), (13, EVAL_OLD), (14, {"loss": 0.02})]


def test_console_prints_a_line_per_log_and_keeps_history(capsys):
    live = live_plot("console")
    drive(live, EVENTS)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(EVENTS) == len(live.history)
    assert lines[0] == "step    0 | eval reward 0.551"
    assert lines[1] == ("step   12 | loss 0.0523 | reward 0.643 ± 0.353 | zero-std 0.25 | "
                        "tools 2.00/rollout, 0.00 failed | 101.8 s/step")
    assert "reward 0.400" in lines[2] and "s/step" in lines[2]  # reward from rewards/<env>/mean, time measured
    assert lines[3] == "step   13 | eval reward 0.300"
    df = live.history
    assert list(df["step"]) == [0, 12, 13, 13, 14]
    assert df.loc[1, "scores/gridsim-v1/grade/mean"] == 0.61 and math.isnan(df.loc[2, "tools/failure_frequency"])
    assert 0 <= df.loc[2, "step_time"] < 1 and df["step_time"].notna().sum() == 3
    assert torch.cuda.is_available() or "gpu_allocated_gib" not in df


def test_notebook_flavour_draws_every_panel_with_data_and_throttles():
    live = NotebookLivePlot(min_interval=3600, baselines={"idle": 0.2, "greedy": 0.76, "optimum": 1.0})
    drive(live, EVENTS)  # drawn at the first log, then throttled until train end
    shown = [ax for ax in live.figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["Reward", "Groups with zero reward std", "Tool calls per rollout",
                                                "Scores", "Step time (s)"]
    assert [ax.get_ylabel() for ax in shown] == ["mean reward", "share of groups", "calls per rollout", "mean score",
                                                 "seconds"]
    assert all(ax.xaxis.get_major_locator()._integer for ax in shown)  # whole steps on the axis
    assert sorted(shown[3].get_legend_handles_labels()[1]) == ["grade", "grade (eval)", "unscored"]
    assert [t.get_text() for t in shown[0].texts] == ["idle 0.20", "greedy 0.76", "optimum 1.00"]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(live.figure).get_renderer()
    for ax in shown:  # a legend sits under its axes, off the data; a panel of one line has none
        legend = ax.get_legend()
        if legend is not None:
            assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0
            assert legend.get_texts()[0].get_fontsize() >= 8
    drawn = live._last_draw
    live.on_log(None, TrainerState(global_step=20), None, logs=dict(TRAIN_12))
    assert live._last_draw == drawn and len(live.history) == len(EVENTS) + 1


def test_factory_picks_console_outside_a_kernel():
    assert type(live_plot()) is ConsoleLivePlot
    assert type(live_plot("notebook")) is NotebookLivePlot  # the kind asked for, not the guess
    with pytest.raises(ValueError, match=r"kind must be one of \['console', 'notebook'\], not 'tensorboard'"):
        live_plot("tensorboard")
    assert format_row({"step": 3}) == "step    3"


KERNEL_CELL = """
import matplotlib; matplotlib.use("Agg")
from agentenv_nb.train.live import NotebookLivePlot, live_plot
from transformers import TrainerState
live = live_plot(min_interval=0)
assert isinstance(live, NotebookLivePlot)
live.on_train_begin(None, TrainerState(), None)
for step in (1, 2):
    live.on_log(None, TrainerState(global_step=step), None, logs={"loss": 0.1, "reward": 0.5, "reward_std": 0.2})
"""


TRAIN_END = "live.on_train_end(None, TrainerState(global_step=2, max_steps=2), None)\n"


@pytest.fixture(scope="module")
def kernel_run():
    """One kernel runs three cells (each a live plot): the factory's own pick, left training; then with the widget
    (JupyterLab's) and without it (Colab's), each to its train end."""
    # Unsloth, imported by earlier tests in this process, sets HF_HUB_ENABLE_HF_TRANSFER, which the kernel inherits
    # and huggingface_hub warns about on stderr: not the plot's output.
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("HF_HUB_ENABLE_HF_TRANSFER", raising=False)
        return run_cells([KERNEL_CELL] + [
            KERNEL_CELL.replace("live_plot(min_interval=0)", f"live_plot(min_interval=0, widget={widget})") + TRAIN_END
            for widget in (True, False)])


def output_models(nb) -> dict:
    """The notebook's ipywidgets Output models, by id."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return {key: model for key, model in state.items() if model["model_name"] == "OutputModel"}


@pytest.mark.slow
def test_in_a_kernel_the_factory_picks_the_notebook_and_draws_into_an_output_widget(kernel_run):
    [view] = kernel_run.cells[0].outputs
    widget = output_models(kernel_run)[view["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]]
    output = widget["state"]["outputs"]
    assert [o["output_type"] for o in output] == ["display_data"] and "image/png" in output[0]["data"]


class Doubler(torch.nn.Module):
    """A one-weight regression model: learns y = 2x in a few steps."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x)
        return {"loss": torch.nn.functional.mse_loss(logits, labels), "logits": logits}


def reward_metrics(pred):
    """Eval metrics named as GRPO's: Trainer prefixes them with ``eval_``."""
    close = (abs(pred.predictions - pred.label_ids) < 1.0).mean()
    return {"reward": float(close), "scores/gridsim/grade/mean": float(close) / 2}


@pytest.mark.slow
def test_real_trainer_run_feeds_live_history_and_eval_curve(tmp_path, capsys):
    data = [{"x": torch.tensor([v / 8]), "labels": torch.tensor([v / 4])} for v in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=0.1, logging_steps=1, eval_strategy="steps", eval_steps=2,
                             eval_on_start=True, save_strategy="steps", save_steps=2, report_to="none",
                             use_cpu=True, disable_tqdm=True, seed=0)
    live = live_plot("console")
    trainer = Trainer(model=Doubler(), args=args, train_dataset=data, eval_dataset=data,
                      compute_metrics=reward_metrics, callbacks=[live])
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]  # not Trainer's own
    assert len(lines) == len(live.history) == len(trainer.state.log_history)
    assert live.history["step_time"].notna().sum() == 4 and live.history["eval_reward"].notna().sum() == 3

    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-4" / "trainer_state.json"
    trainer.save_state()
    assert find_trainer_state(tmp_path) == tmp_path / "trainer_state.json"
    df = eval_curve(tmp_path)
    assert list(df.columns) == ["step", "eval_reward", "eval_scores/gridsim/grade/mean"]
    assert list(df["step"]) == [0, 2, 4] and df["eval_reward"].between(0, 1).all()
    assert df.equals(eval_curve(tmp_path / "checkpoint-4")) and df.equals(eval_curve(trainer.state.log_history))

    png, csv = save_eval_curve(df, tmp_path / "plots", baselines={"idle": 0.2, "greedy": 0.76, "optimum": 1.0})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pd.testing.assert_frame_equal(pd.read_csv(csv), df)


def test_eval_curve_falls_back_to_per_env_rewards_and_reference_is_the_seed_table(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 13, "log_history": [
        {**TRAIN_12, "step": 12}, {**EVAL_OLD, "step": 13}]}))
    df = eval_curve(tmp_path)
    assert df["eval_reward"].tolist() == [0.3] and df["step"].tolist() == [13]
    assert eval_curve([{**TRAIN_12, "step": 1}]).empty
    trained, reference = GridSimAdapter().reference()
    assert trained == "Qwen3-4B, gridsim-v1" and reference["NeMo RL"] == {0: 0.55, 20: 0.68, 40: 0.67}
    assert [table[40] for table in reference.values()] == [0.59, 0.61, 0.61, 0.60, 0.57, 0.67]


def test_the_table_and_the_curve_leave_out_what_only_repeats_the_reward():
    df = pd.DataFrame({"step": [0, 4], "eval_reward": [0.300946, 0.0], "eval_rewards/g/mean": [0.300946 + 1e-8, 0.0],
                       "eval_scores/g/schedule/mean": [0.300946, 1e-9], "eval_scores/g/other/mean": [0.5, 0.25]})
    table = eval_table(df)
    assert list(table) == ["step", "eval_reward", "eval_scores/g/other/mean"]
    assert table["eval_reward"].tolist() == [0.301, 0.0]
    reference = GridSimAdapter().reference()
    ax = plot_eval_curve(df, reference=reference).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "eval_scores/g/other/mean" in labels and "eval_scores/g/schedule/mean" not in labels
    assert ax.get_legend().get_title().get_text() == "reference runs: 40 steps, cut at this run's step 4"
    assert "TRL (Qwen3-4B, gridsim-v1)" in labels
    assert plot_eval_curve(df.assign(step=[0, 40]), reference=reference).axes[0].get_legend().get_title().get_text() == ""
    assert plot_eval_curve(df).axes[0].get_legend().get_title().get_text() == ""  # no reference: no runs to cut


def doubler_trainer(out, callbacks=(), resume=False):
    """The Doubler on a 4-step run with evals at the start and the end, resuming as the presets say."""
    from agentenv_nb.train.presets import sft_kwargs

    resuming = {k: v for k, v in sft_kwargs("cpu-tiny", output_dir=str(out), resume=resume).items()
                if k in ("resume_from_checkpoint", "eval_on_start")}
    data = [{"x": torch.tensor([v / 8]), "labels": torch.tensor([v / 4])} for v in range(64)]
    args = TrainingArguments(**{"eval_on_start": True, **resuming}, output_dir=str(out), max_steps=4,
                             per_device_train_batch_size=4, learning_rate=0.1, logging_steps=1, eval_strategy="steps",
                             eval_steps=4, save_strategy="steps", save_steps=2, report_to="none", use_cpu=True,
                             disable_tqdm=True, seed=0)
    return Trainer(model=Doubler(), args=args, train_dataset=data, eval_dataset=data[:8],
                   compute_metrics=reward_metrics, callbacks=list(callbacks))


@pytest.mark.slow
def test_a_resumed_run_says_so_and_never_trains_past_max_steps(tmp_path, capsys):
    import shutil

    from agentenv_nb.train.fit import fit

    assert fit(doubler_trainer(tmp_path))["trainable_parameters"] == 2
    shutil.rmtree(tmp_path / "checkpoint-4")  # a disconnect after step 3: the last checkpoint is step 2's
    trainer = doubler_trainer(tmp_path, resume=True)
    fit(trainer)
    assert "resumed from checkpoint 2, step 2 of 4" in capsys.readouterr().out
    evals = [log["step"] for log in trainer.state.log_history if "eval_loss" in log]
    assert trainer.state.global_step == 4 and evals == [0, 4]  # no second eval at the resumed step

    live = live_plot("console")
    trainer = doubler_trainer(tmp_path, callbacks=[live], resume=True)  # Restart and Run All on the finished run
    fit(trainer)
    assert "is step 4 of 4: the run is finished" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert trainer.state.global_step == 4 and live.history["eval_reward"].notna().sum() == 2


def run_cells(sources: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    repo = Path(__file__).resolve().parents[1]
    NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(repo)}}).execute()
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("cell", [1, 2], ids=["jupyterlab", "colab"])
def test_at_train_end_the_plot_is_left_as_a_plain_image_every_viewer_shows(cell, kernel_run):
    outputs = kernel_run.cells[cell].outputs
    assert len(outputs) == 1, outputs  # the widget, or the image, updated in place: one output
    [output] = outputs
    assert output["output_type"] == "display_data" and list(output["data"]) == ["image/png", "text/plain"]
    # the first two cells' widgets: Colab's path never makes one
    assert len(output_models(kernel_run)) == 2


def test_an_eval_before_any_step_shows_its_progress_not_an_empty_figure():
    live = NotebookLivePlot(widget=False, min_interval=0)
    state = TrainerState(global_step=0, max_steps=4)
    live.on_train_begin(None, state, None)
    assert live.figure.get_size_inches()[1] < 1  # a line, not a blank 480-pixel plot
    for _ in range(2):
        live.on_prediction_step(None, state, None, eval_dataloader=[0, 1, 2])
    assert live.progress.startswith("running · step 0 of 4 · 0:00 · eval batch 2 of 3 · 0:0")
    assert live.progress.endswith("left")
    live.on_evaluate(None, state, None)
    live.on_log(None, state, None, logs={"eval_reward": 0.3})
    assert "eval" not in live.progress and live.figure.get_size_inches()[1] == 3.5  # one panel: one row


def test_one_panel_fills_the_figure_and_two_take_a_row_each():
    """SFT logged only its loss on the tiny CPU model: its one panel was drawn in the top half of a figure of two rows,
    the lower half saved blank."""
    live = NotebookLivePlot(widget=False, min_interval=0)
    state = TrainerState(global_step=1, max_steps=4)
    live.on_train_begin(None, state, None)
    live.on_log(None, state, None, logs={"loss": 2.0})
    [ax] = [ax for ax in live.figure.axes if ax.get_visible()]
    assert live.figure.get_size_inches()[1] == 3.5 and ax.get_position().height > 0.5
    live.on_log(None, state, None, logs={"loss": 1.5, "mean_token_accuracy": 0.4})
    assert live.figure.get_size_inches()[1] == 7 and len([ax for ax in live.figure.axes if ax.get_visible()]) == 2


def test_the_progress_line_counts_steps_and_time_left():
    live = NotebookLivePlot(widget=False)
    live.on_train_begin(None, TrainerState(global_step=10, max_steps=40), None)
    live.on_step_end(None, TrainerState(global_step=20, max_steps=40), None)
    assert live.progress.startswith("running · step 20 of 40 · 0:0") and live.progress.endswith(" left")
    live.on_train_end(None, TrainerState(global_step=40, max_steps=40), None)
    assert live.progress.startswith("finished · step 40 of 40")
    assert "left" not in live.progress and live.figure.get_suptitle() == live.progress


def test_a_flat_eval_curve_is_drawn_on_the_rewards_whole_range():
    """The tiny model on a bundle without partial credit scores 0 at every eval: on matplotlib's own -0.04..0.04 axis
    that line read as noise around 0."""
    flat = pd.DataFrame({"step": [0, 2, 4], "eval_reward": [0.0, 0.0, 0.0]})
    [ax] = plot_eval_curve(flat, baselines={"before training": 0.0}).axes
    low, high = ax.get_ylim()
    assert low <= -0.04 and high >= 1.0
    [ax] = plot_eval_curve(pd.DataFrame({"step": [0, 2], "eval_reward": [0.2, 0.6]})).axes
    assert ax.get_ylim()[1] < 1.0  # a curve that moves keeps its own range
