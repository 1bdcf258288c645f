"""Notebook 03's GRPO run, written once: its parameters and their defaults (``GRPORun``), and its steps, which the
notebook's cells call in order, as the training command (``python -m agentenv_nb.train``) and bench/gpu_grpo.py do.

    run = GRPORun.of(globals())                     # the notebook's parameters cell; or GRPORun(preset="16bit")
    preset = run_preset(run)                        # PRESET, with the run's LoRA rank and rollouts over its own
    config = run_config(run, preset, warm_start)    # TRAINER's config, resuming from RUN_DIR/grpo's last checkpoint
    bundle = resolve_bundle(run)                    # train.run's: fetched, its sandbox chosen, its envs checked
    env = serve(run, bundle, session_limit(run, config, bundle))   # train.run's, holding the sessions the run opens
    model, tokenizer = load(preset, warm_start, env)
    trainer = train(run, preset, model, tokenizer, config, env, callbacks=[live])   # trial step, fit, state saved
    played, table = greedy_eval(run, trainer.model, tokenizer, env, config)
    saved = export(run, trainer.model, tokenizer)
"""

from __future__ import annotations

import dataclasses
import math

from agentenv_nb.stops import Stop
from agentenv_nb.train.naming import NOTEBOOK, Naming
from agentenv_nb.train.presets.recipes import PRESETS, RECIPE
from agentenv_nb.train.run import PRESET_HELP, Run, parameter


def _figures(setting, small: str = "") -> str:
    """What "unset" gives for a trainer setting, from the presets themselves: ``setting`` (a field's name, or a
    function of a preset) in the recipe, in a small model (the recipe's field ``small``), then in each preset that
    differs from the recipe."""
    value = setting if callable(setting) else lambda preset: getattr(preset, setting)
    shown = [f"{value(RECIPE):g}"]
    if small:
        shown.append(f"a model under {RECIPE.small_model_below / 1e9:g}B parameters {getattr(RECIPE, small):g}")
    shown += [f"'{name}' {value(preset):g}" for name, preset in PRESETS.items() if value(preset) != value(RECIPE)]
    return f"({'; '.join(shown)})"


def _rollouts_a_step(preset) -> int:
    return preset.per_device_train_batch_size * preset.gradient_accumulation_steps


@dataclasses.dataclass(frozen=True)
class GRPORun(Run):
    """A GRPO run's parameters, in groups as TRL's GRPOConfig has its own ("Parameters that control ...", ``groups``):
    the data and where the run goes, the envs (``Run``'s, every stage's), then the model and the trainer, the training,
    the logging and the export, the greedy eval after training."""

    warm_start: str = parameter("", "the SFT model, a folder or a Hub id; empty: RUN_DIR/sft/merged, which notebook "
                                    "02 writes", opens="the model and the trainer")
    preset: str = parameter("auto", PRESET_HELP)

    trainer: str = parameter("grpo", "'grpo': TRL's GRPOTrainer (Unsloth's), eval points every eval_steps; 'async': "
                                     "Unsloth's AsyncGRPOTrainer, generating the next batch on the model's own vLLM "
                                     "while this one trains (one GPU with vLLM; no eval loop: the greedy eval after "
                                     "training is its figure)")

    max_steps: int | None = parameter(None, "the step to train to, more to learn more; unset: the preset's max_steps "
                                            f"{_figures('max_steps')}", opens="the training, over the preset's")
    learning_rate: float | None = parameter(None, "the optimizer's peak learning rate, lower where the reward "
                                                  "swings or the tools are dropped; unset: the preset's "
                                                  f"{_figures('learning_rate', small='small_learning_rate')}")
    temperature: float | None = parameter(None, "the rollouts' sampling temperature, higher where a group's "
                                                "rollouts score alike; unset: the preset's "
                                                f"{_figures('temperature', small='small_temperature')}")
    lora_rank: int | None = parameter(None, "LoRA's rank r, its alpha scaled with it "
                                            f"(r{RECIPE.lora_r}/alpha{RECIPE.lora_alpha}), larger to learn more, "
                                            f"slower; unset: the preset's {_figures('lora_r')}")
    rollouts_a_step: int | None = parameter(None, "the rollouts a step trains on, a GPU's: tasks a step x "
                                                  "num_generations, fewer where a step doesn't fit the card; unset: "
                                                  f"the preset's {_figures(_rollouts_a_step)}")
    num_generations: int | None = parameter(None, "rollouts a task, the group GRPO compares, more where a group's "
                                                  f"rollouts score alike; unset: the preset's "
                                                  f"{_figures('num_generations')}")
    save_steps: int = parameter(5, "a checkpoint every this many steps, to resume from, lower to lose less "
                                   "to a disconnect (0: none)")

    report_to: str = parameter("none", "also log to 'tensorboard', 'trackio' or 'wandb': reward and every score, by "
                                       "step", opens="the logging and the export")
    gguf: str = parameter("q8_0", "the GGUF export's quantization, where llama.cpp is built; '' for none")
    build_llama_cpp: bool = parameter(False, "where no built llama.cpp is found, let Unsloth's exporter download and "
                                             "build it for the GGUF: minutes, and a network (Colab has one)")
    push_to_hub: str = parameter("", "a Hub repo (you/my-agent) for the trained model, private; needs "
                                     "HF_TOKEN")

    eval_days: int = parameter(50, "eval tasks played greedily after training, the first ones, as notebook 02 "
                                   "scores the warm start (give both the same); 0: none",
                               opens="the greedy eval after training")
    max_new_tokens: int = parameter(256, "a reply's budget in that eval, as notebook 02's")
    try_day: int = parameter(0, "the eval task notebook 03's \"Try it\" plays, by its index", notebook_only=True)
    try_prompt: str = parameter("", "your own words for that task, in place of its prompt", notebook_only=True)


# The run's steps, in the order notebook 03 calls them


def run_preset(run: GRPORun, naming: Naming = NOTEBOOK, settings: dict | None = None):
    """The run's preset (``presets.named``: "auto" is the card's) with the run's LoRA rank (its alpha scaled with it),
    rollouts a step and rollouts a task over its own, and over all the GRPOConfig ``settings`` (the command's
    ``--set``) that are the preset's fields too: vLLM is sized, and the model loaded, from it, so for the completion
    budget and rollouts the run will have. Rollouts that make no whole groups stop with a line in ``naming``'s
    words."""
    from agentenv_nb.train import presets

    preset = presets.named(run.preset)
    changes = {}
    if run.lora_rank:
        changes.update(lora_r=run.lora_rank, lora_alpha=preset.lora_alpha * run.lora_rank // preset.lora_r)
    generations = run.num_generations or preset.num_generations
    if run.rollouts_a_step or run.num_generations:
        rollouts = run.rollouts_a_step or preset.per_device_train_batch_size * preset.gradient_accumulation_steps
        if rollouts % generations:
            raise Stop(f"{rollouts} rollouts a step don't make whole groups of {generations} rollouts a task "
                       f"({naming.name('num_generations')}): {naming.set_to('rollouts_a_step')} a multiple of it")
        batch = math.gcd(rollouts, preset.per_device_train_batch_size)  # the preset's micro-batch, or what divides
        changes.update(per_device_train_batch_size=batch, gradient_accumulation_steps=rollouts // batch,
                       num_generations=generations)
    fields = {field.name for field in dataclasses.fields(preset)}
    return dataclasses.replace(preset, **{**changes, **{k: v for k, v in (settings or {}).items() if k in fields}})


def run_config(run: GRPORun, preset, model_name: str, **overrides):
    """The checked config of the run's trainer (``presets.trainer_config``) for ``preset``, in RUN_DIR/grpo, resuming
    from its last checkpoint, with the run's max_steps, save_steps, learning rate and temperature (over a small
    model's, ``model_name`` being counted), and ``overrides`` (GRPOConfig settings) over all."""
    from agentenv_nb.train import presets

    chosen = {name: value for name, value in (("learning_rate", run.learning_rate), ("temperature", run.temperature))
              if value is not None}
    return presets.trainer_config(run.trainer, preset, **{
        "output_dir": f"{run.run_dir}/grpo", "max_steps": run.max_steps, "save_steps": run.save_steps, "resume": True,
        "model_name": model_name, **chosen, **overrides})


def greedy_eval_sessions(run: GRPORun, config) -> int:
    """The sessions played beside the trainer's after training, while its environments still hold theirs: the greedy
    eval's, an eval batch of EVAL_DAYS at most, or the one of notebook 03's "Try it" where there is no eval."""
    return max(1, min(run.eval_days, config.per_device_eval_batch_size))


def session_limit(run: GRPORun, config, bundle) -> int:
    """The sessions the env servers hold, every rank's (``sessions.sessions_needed``): what the trainer opens at once,
    a pool a toolset of ``bundle`` (a resolved one), and the greedy eval's beside them."""
    from agentenv_nb.tasks.bundles import toolset_count
    from agentenv_nb.train.sessions import sessions_needed

    return sessions_needed(config, toolset_count(bundle.folder, run.toolsets), beside=greedy_eval_sessions(run, config))


def load(preset, model_name: str, env):
    """``model_name`` loaded as ``preset`` says (``loading.load_model``), checked against ``env`` (its chat template,
    tools and thinking: ``AgentEnv.check``); returns (model, tokenizer)."""
    from agentenv_nb.train.model import loading

    model, tokenizer = loading.load_model(model_name, preset)
    env.check(tokenizer)
    return model, tokenizer


def train(run: GRPORun, preset, model, tokenizer, config, env, callbacks=(), trial: bool = True):
    """The trainer ``config`` configures (``trainer.trainer_for``: TRL's GRPOTrainer, or the async one) on ``env``
    with ``env.metrics`` and ``callbacks``; with ``trial``, one step at the worst case first (``trial.check``: does it
    fit, how long); then trained (``fit``: resumes from the last checkpoint, never past MAX_STEPS, logging to
    REPORT_TO too) and its state saved (trainer_state.json, every log). Returns the trainer."""
    from agentenv_nb.train.fit import fit
    from agentenv_nb.train.grpo import trial as trial_step
    from agentenv_nb.train.grpo.trainer import trainer_for

    trainer = trainer_for(model, tokenizer, config, env, callbacks=[env.metrics, *callbacks])
    if trial:
        print(trial_step.check(model, tokenizer, config, env, preset))
    fit(trainer, report_to=run.report_to)
    trainer.save_state()  # on the main process only
    return trainer


def greedy_eval(run: GRPORun, model, tokenizer, env, config):
    """The first EVAL_DAYS eval tasks played greedily, an eval batch at a time, as notebook 02 scores the warm start;
    kept as "after GRPO" in RUN_DIR/greedy-evals.csv. Returns the rollouts and that table, every stage's."""
    from agentenv_nb.train.rollout import greedy_evals, play, summary

    played = play(model, tokenizer, env.factory, env.dataset_for("eval", first=run.eval_days),
                  batch_size=config.per_device_eval_batch_size, max_new_tokens=run.max_new_tokens)
    return played, greedy_evals(run.run_dir, {"after GRPO": summary(played)})


def export(run: GRPORun, model, tokenizer, naming: Naming = NOTEBOOK) -> dict:
    """The trained model saved in RUN_DIR/trained (``export.export_model``: the adapter, the merged model, the GGUF
    where llama.cpp is built or BUILD_LLAMA_CPP), pushed to PUSH_TO_HUB where set; returns where each went."""
    from agentenv_nb.train.export import export_model

    return export_model(model, tokenizer, f"{run.run_dir}/trained", gguf=run.gguf, push_to_hub=run.push_to_hub,
                        build_llama_cpp=run.build_llama_cpp, naming=naming)
