"""Run a trainer as a notebook's train cell should: say what it resumes, never train past ``max_steps``, and
report afterwards what the run cost, as Unsloth's notebooks do (trainable parameters, minutes, peak GPU memory).

    config = presets.grpo_config("24gb", output_dir="out", max_steps=40, save_steps=5, resume=True)
    trainer = GRPOTrainer(..., args=config)
    fit(trainer)   # "resumed from checkpoint 20, step 20 of 40" ... "12.5 minutes, peak GPU memory 11.1 GiB"

Why it is needed: transformers' loop takes an optimizer step before it checks ``max_steps``, so
``trainer.train(resume_from_checkpoint=...)`` on a finished run's last checkpoint trains one step more.
"""

from __future__ import annotations

import time
from pathlib import Path

_GIB = 2**30


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, all) parameter counts of ``model``."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def fit(trainer, resume_from_checkpoint: str | None = None) -> dict[str, float]:
    """``trainer.train()`` from ``resume_from_checkpoint`` (default: the config's), saying so; a finished run's
    checkpoint is loaded, not trained again, and the trainer's callbacks see its whole run (the live plot draws it).
    A callback that shows its own progress (``shows_progress``, as the notebook's live plot does) replaces
    transformers' progress table.
    Returns the trainable parameter count, the minutes trained and the peak GPU memory (GiB, 0 on a CPU)."""
    import torch
    from transformers import TrainerState

    args = trainer.args
    if any(getattr(callback, "shows_progress", False) for callback in trainer.callback_handler.callbacks):
        from transformers.utils.notebook import NotebookProgressCallback

        trainer.remove_callback(NotebookProgressCallback)  # its table repeats the plot, a row a log, 25 columns wide
    checkpoint = resume_from_checkpoint or args.resume_from_checkpoint
    trainable, total = trainable_parameters(trainer.model)
    print(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.2f}%)")
    report = {"trainable_parameters": trainable, "minutes": 0.0, "peak_gpu_gib": 0.0}
    if checkpoint:
        saved = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
        last = args.max_steps if args.max_steps > 0 else saved.max_steps
        if saved.global_step >= last:
            print(f"{checkpoint} is step {saved.global_step} of {last}: the run is finished, nothing to train "
                  f"(raise max_steps to train on, or pick a new output_dir to start over)")
            trainer.state = saved
            trainer.control = trainer.callback_handler.on_train_begin(args, saved, trainer.control)
            trainer.control = trainer.callback_handler.on_train_end(args, saved, trainer.control)
            return report
        print(f"resumed from checkpoint {saved.global_step}, step {saved.global_step} of {last}")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    report["minutes"] = (time.perf_counter() - start) / 60
    if torch.cuda.is_available():
        report["peak_gpu_gib"] = torch.cuda.max_memory_reserved() / _GIB
    print(f"trained to step {trainer.state.global_step} of {trainer.state.max_steps} in {report['minutes']:.1f} "
          f"minutes" + (f", peak GPU memory {report['peak_gpu_gib']:.1f} GiB" if report["peak_gpu_gib"] else ""))
    return report
