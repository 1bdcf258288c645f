"""Run a trainer as a notebook's train cell should: say what it resumes, never train past ``max_steps``, and
report afterwards what the run cost, as Unsloth's notebooks do (trainable parameters, minutes, peak GPU memory).

    config = presets.grpo_config("24gb", output_dir="out", max_steps=40, save_steps=5, resume=True)
    trainer = GRPOTrainer(..., args=config)
    fit(trainer)   # "resumed from checkpoint 20, step 20 of 40" ... "12.5 minutes, peak GPU memory 11.1 GiB"

Why it is needed: transformers' loop takes an optimizer step before it checks ``max_steps``, so
``trainer.train(resume_from_checkpoint=...)`` on a finished run's last checkpoint trains one step more. On a finished
run ``fit`` loads the checkpoint's weights, optimizer and scheduler itself, with transformers' own loaders (its
Trainer's ``_load_from_checkpoint`` and ``_load_optimizer_and_scheduler``, pinned with transformers 5.17.0;
tests/test_fit.py compares the weights), so what is played or exported afterwards is the trained model.
"""

from __future__ import annotations

import time
from pathlib import Path

from agentenv_nb.library_log import to_log

_GIB = 2**30


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, all) parameter counts of ``model``."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def duration(seconds: float) -> str:
    """A wall time as a person reads it: "42 s", "12.5 minutes", "4.5 hours"."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} minutes" if seconds < 5400 else f"{seconds / 3600:.1f} hours"


def load_checkpoint(trainer, checkpoint: str, max_steps: int) -> None:
    """Put ``checkpoint``'s weights (its LoRA adapter, or the whole model) into ``trainer.model``, and its optimizer
    and scheduler, where saved, into a new optimizer and scheduler for ``max_steps``: as ``train()`` resumes."""
    trainer._load_from_checkpoint(checkpoint)
    trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
    trainer._load_optimizer_and_scheduler(checkpoint)


def fit(trainer, resume_from_checkpoint: str | None = None, report_to: str | None = None) -> dict[str, float]:
    """``trainer.train()`` from ``resume_from_checkpoint`` (default: the config's), saying so; a finished run's
    checkpoint is loaded (weights, optimizer, scheduler), not trained again, and the trainer's callbacks see its whole
    run (the live plot draws it). ``report_to`` ("tensorboard", "trackio", "wandb") adds transformers' integration
    (``tracking.track``); score metrics (``ScoreLog``) go first among the callbacks, so every integration logs them.
    A ``HealthCheck`` is added where none was given: each signal of trouble said once, in words, with its advice
    (the live plot's ``optimum`` baseline, where a task adapter knows it, a ceiling for the reward).
    A callback that shows its own progress (``shows_progress``, as the notebook's live plot does) replaces
    transformers' progress table.
    Returns the trainable parameter count, the minutes trained and the peak GPU memory (GiB, 0 on a CPU)."""
    import torch
    from transformers import TrainerState

    from agentenv_nb.client.metrics import ScoreLog
    from agentenv_nb.train.health import HealthCheck
    from agentenv_nb.train.tracking import track

    args = trainer.args
    if report_to:
        track(trainer, report_to)
    callbacks = trainer.callback_handler.callbacks
    callbacks.sort(key=lambda callback: not isinstance(callback, ScoreLog))  # stable: the others keep their order
    if not any(isinstance(callback, HealthCheck) for callback in callbacks):  # after ScoreLog and the live plot
        scores = next((callback for callback in callbacks if isinstance(callback, ScoreLog)), None)
        optimum = next((callback.baselines["optimum"] for callback in callbacks
                        if "optimum" in (getattr(callback, "baselines", None) or {})), None)
        trainer.add_callback(HealthCheck(scores=scores, optimum=optimum))
    if any(getattr(callback, "shows_progress", False) for callback in trainer.callback_handler.callbacks):
        from transformers.utils.notebook import NotebookProgressCallback

        trainer.remove_callback(NotebookProgressCallback)  # its table repeats the plot, a row a log, 25 columns wide
    checkpoint = resume_from_checkpoint or args.resume_from_checkpoint
    trainable, total = trainable_parameters(trainer.model)
    # 100% reads like a LoRA gone wrong: said to be a full fine-tune (the tiny CPU preset's SFT: full_finetuning)
    whole = ": every weight, a full fine-tune, not LoRA" if trainable == total else ""
    print(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.2f}%){whole}")
    report = {"trainable_parameters": trainable, "minutes": 0.0, "peak_gpu_gib": 0.0}
    if checkpoint:
        saved = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
        last = args.max_steps if args.max_steps > 0 else saved.max_steps
        if saved.global_step >= last:
            print(f"checkpoint {saved.global_step} is step {saved.global_step} of {last}: the run is finished, "
                  f"nothing to train; its weights are loaded (raise max_steps to train on, or pick a new output_dir "
                  f"to start over)")
            with to_log("loading the checkpoint"):
                load_checkpoint(trainer, checkpoint, saved.max_steps)
            trainer.state = saved
            trainer.control = trainer.callback_handler.on_train_begin(args, saved, trainer.control)
            trainer.control = trainer.callback_handler.on_train_end(args, saved, trainer.control)
            return report
        print(f"resumed from checkpoint {saved.global_step}, step {saved.global_step} of {last}")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with to_log("training", keep_displays=True):  # the live plot
        trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start
    report["minutes"] = seconds / 60
    if torch.cuda.is_available():
        report["peak_gpu_gib"] = torch.cuda.max_memory_reserved() / _GIB
    print(f"trained to step {trainer.state.global_step} of {trainer.state.max_steps} in {duration(seconds)}"
          + (f", peak GPU memory {report['peak_gpu_gib']:.1f} GiB" if report["peak_gpu_gib"] else ""))
    return report
