"""Notebook 03's GRPO run: its parameters and their defaults, in one place. The notebook's parameters cell, the
training command's options (``python -m agentenv_nb.train``) and the tiny run CI and the demo make read them here.

    run = GRPORun()                                 # gridsim-v1, the card's preset and its max_steps, ...
    dataclasses.replace(run, preset="16bit")        # a run of your own
    run.parameters()                                # {"BUNDLE": "gridsim-v1", ...}: the notebook's names
    run.table()                                     # each parameter, its value and what it sets, whole
"""

from __future__ import annotations

import dataclasses
import os
import typing

SANDBOXES = ("auto", "process", "modal", "local")
TRAINERS = ("grpo", "async")  # the trainers train.grpo.trainer.trainer_for makes, by presets.trainer_config


def servers_for_host(most: int = 8) -> int:
    """Env server processes for this host: one a core this process may run on, at most ``most``. Each prepares the
    whole bundle as it starts: on 2 cores and 1,800 GridSim tasks, 2 started in 28 s, as 1 did, and 8 in 103 s or past
    the 2-minute start timeout, no faster at play (bench/expert_replay.py, docs/benchmarks.md)."""
    return min(most, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _parameter(default, help: str, notebook_only: bool = False):
    return dataclasses.field(default=default, metadata={"help": help, "notebook_only": notebook_only})


@dataclasses.dataclass(frozen=True)
class GRPORun:
    """A GRPO run's parameters: what to train on, with which preset, where, and how the envs are served."""

    bundle: str = _parameter("gridsim-v1", "a name from bundles.txt, or a bundle folder")
    bundles_dir: str = _parameter("bundles", "where bundles are downloaded or generated")
    run_dir: str = _parameter("runs/gridsim", "where models, checkpoints, logs and plots go; GRPO's in RUN_DIR/grpo")
    warm_start: str = _parameter("", "the SFT model, a folder or a Hub id; empty: RUN_DIR/sft/merged, which notebook "
                                     "02 writes")
    preset: str = _parameter("auto", "'auto': the preset that fits this card ('24gb' on 20 GB or more, '16gb' below, "
                                     "as on a T4, 'cpu-tiny' with no GPU); or a name from presets.PRESETS ('16bit')")
    trainer: str = _parameter("grpo", "'grpo': TRL's GRPOTrainer (Unsloth's), eval points every eval_steps; 'async': "
                                      "Unsloth's AsyncGRPOTrainer, generating the next batch on the model's own vLLM "
                                      "while this one trains (one GPU with vLLM; no eval loop: the greedy eval after "
                                      "training is its figure)")
    sandbox: str = _parameter("auto", "where envs run: 'auto' (chosen for the bundle), 'process', 'modal', 'local' "
                                      "(Docker)")
    max_steps: int | None = _parameter(None, "the step to train to; unset (None): the preset's max_steps")
    save_steps: int = _parameter(5, "a checkpoint every few steps, to resume from (0: none)")
    server_processes: int = _parameter(servers_for_host(), "env servers beside the trainer, off its GIL (default: one "
                                                           "a core, up to 8); 0: a thread of this process")
    reward: str = _parameter("", "for tasks that record several scores: 'mean', 'min', 'max' of them, or a score's "
                                 "step id; empty: the task's one score")
    toolsets: str = _parameter("first", "'each' for a bundle whose tasks differ in tools (a class a toolset, each row "
                                        "routed to its own); 'first': the first task's tools are every task's")
    report_to: str = _parameter("none", "also log to 'tensorboard', 'trackio' or 'wandb': reward and every score, by "
                                        "step")
    gguf: str = _parameter("q8_0", "the GGUF export's quantization, where llama.cpp is built; '' for none")
    build_llama_cpp: bool = _parameter(False, "where no built llama.cpp is found, let Unsloth's exporter download and "
                                              "build it for the GGUF: minutes, and a network (Colab has one)")
    push_to_hub: str = _parameter("", "a Hub repo (you/my-agent) for the trained model, private; needs "
                                      "HF_TOKEN")
    eval_days: int = _parameter(50, "eval tasks played greedily after training, the first ones, as notebook 02 "
                                    "scores the warm start (give both the same); 0: none")
    max_new_tokens: int = _parameter(256, "a reply's budget in that eval, as notebook 02's")
    try_day: int = _parameter(0, "the eval task notebook 03's \"Try it\" plays, by its index", notebook_only=True)
    try_prompt: str = _parameter("", "your own words for that task, in place of its prompt", notebook_only=True)

    def parameters(self) -> dict:
        """The parameters under the notebook's names: {"BUNDLE": ..., "MAX_STEPS": ...}."""
        return {field.name.upper(): getattr(self, field.name) for field in dataclasses.fields(self)}

    def changed(self) -> dict:
        """The parameters, under the notebook's names, that differ from the defaults."""
        default = type(self)()
        return {name: value for name, value in self.parameters().items()
                if value != getattr(default, name.lower())}

    def table(self):
        """Each parameter, its value and what it sets, whole (``tables.text_table``: ``.data`` is the DataFrame)."""
        import pandas as pd

        from agentenv_nb.tables import text_table

        rows = [(field.name.upper(), repr(getattr(self, field.name)), field.metadata["help"])
                for field in dataclasses.fields(self)]
        return text_table(pd.DataFrame(rows, columns=["parameter", "value", "what it sets"]))

    @classmethod
    def command_options(cls) -> list[str]:
        """The parameters the training command takes too: all but those of the notebook's own cells ("Try it")."""
        return [field.name for field in dataclasses.fields(cls) if not field.metadata["notebook_only"]]

    @classmethod
    def help(cls, name: str) -> str:
        """What parameter ``name`` (``max_steps`` or ``MAX_STEPS``) sets."""
        return cls.__dataclass_fields__[name.lower()].metadata["help"]

    @classmethod
    def kind(cls, name: str) -> type:
        """The type of parameter ``name``'s values, None aside: ``int`` for ``max_steps``."""
        hint = typing.get_type_hints(cls)[name.lower()]
        return next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)
