"""Notebook 02's SFT warm start, written once: its parameters and their defaults (``SFTRun``), and its steps, which
the notebook's cells call in order, as ``python -m agentenv_nb.train sft`` and bench/gpu_sft.py do.

    run = SFTRun.of(globals())                      # the notebook's parameters cell; or SFTRun(model="tiny")
    preset = run_preset(run)                        # PRESET, looked up once ("auto": the card's)
    bundle = resolve_bundle(run)                    # train.run's: fetched, its sandbox chosen, its envs checked
    env = serve(run, bundle, session_limit(run, preset, bundle))
    start = demonstrations(run, bundle, env)        # the expert's, DEMOS, or the model's own: says which
    model, tokenizer = load(run, preset, start, env)
    before = greedy_eval(run, preset, model, tokenizer, env)
    trainer = train(run, preset, model, tokenizer, env, start, callbacks=[live])   # TRL's SFTTrainer, fit
    after = greedy_eval(run, preset, model, tokenizer, env)
    warm_start = save(run, model, tokenizer)        # RUN_DIR/sft/merged, which notebook 03 loads
    check_learned(summary(after), preset)           # warm_start.sources': a GPU run that didn't learn stops here
    distill(run, preset, model, tokenizer, env, summary(after), callbacks=[live])   # DISTILL_ROUNDS rounds
"""

from __future__ import annotations

import dataclasses

from agentenv_nb.train.presets.recipes import PRESETS, RECIPE
from agentenv_nb.train.run import PRESET_HELP, Run, parameter


@dataclasses.dataclass(frozen=True)
class SFTRun(Run):
    """An SFT warm start's parameters, in groups as ``GRPORun`` has its own: the data and where the run goes, the envs
    (``Run``'s, every stage's), then the model, the demonstrations, the fine-tuning, the greedy evals, the
    self-distillation."""

    model: str = parameter("unsloth/Qwen3-4B", "a Hub model, a folder or a .gguf file; 'tiny' builds the offline CPU "
                                               "model", opens="the model")
    preset: str = parameter("auto", PRESET_HELP)

    demos: str = parameter("", "a JSONL of demonstrations in TRL's chat format, for a bundle without an expert; "
                               "empty: the bundle's expert, else the model's own best rollouts",
                           opens="the demonstrations")

    sft_steps: int | None = parameter(None, "SFT steps, more to follow the demonstrations more closely; unset: the "
                                            f"preset's ({RECIPE.sft_num_train_epochs} pass over them, "
                                            f"{RECIPE.small_sft_num_train_epochs} for a model under "
                                            f"{RECIPE.small_model_below / 1e9:g}B parameters; 'cpu-tiny': "
                                            f"{PRESETS['cpu-tiny'].sft_max_steps} steps, "
                                            f"{PRESETS['cpu-tiny'].pretrained_sft_max_steps} for a pretrained model)",
                                      opens="the fine-tuning")

    eval_days: int = parameter(50, "eval tasks scored greedily before and after SFT, the first ones, as notebook 03 "
                                   "scores the trained model (give both the same)",
                               opens="the greedy evals before and after")
    max_new_tokens: int = parameter(256, "a reply's budget when scoring")

    distill_rounds: int = parameter(1, "self-distillation rounds after SFT (agent-lightning's recipe), each on the "
                                       "model's best rollouts; 0: none", opens="the self-distillation")
    distill_steps: int = parameter(60, "SFT steps a round")


# The run's steps, in the order notebook 02 calls them


def run_preset(run: SFTRun):
    """The run's preset, looked up once (``presets.named``: "auto" is the card's, said in a line)."""
    from agentenv_nb.train import presets

    return presets.named(run.preset)


def session_limit(run: SFTRun, preset, bundle) -> int:
    """The sessions the env servers hold (``sessions.play_sessions``): an eval batch of ``preset`` a toolset of
    ``bundle`` (a resolved one), which the greedy evals, the expert's demonstrations and self-distillation play in."""
    from agentenv_nb.tasks.bundles import toolset_count
    from agentenv_nb.train.sessions import play_sessions

    return play_sessions(preset, toolset_count(bundle.folder, run.toolsets))


def demonstrations(run: SFTRun, bundle, env):
    """What the warm start learns from (``sources.choose``), said in a line: ``bundle``'s expert played on ``env``'s
    train tasks, else DEMOS, else the model's own best rollouts."""
    from agentenv_nb.train.warm_start import sources

    return sources.choose(bundle.folder, env, demos=run.demos)


def load(run: SFTRun, preset, start, env):
    """MODEL loaded for SFT as ``preset`` says (``loading.load_model``; "tiny" built from ``start``'s
    demonstrations, in RUN_DIR/models), checked against ``env`` (``AgentEnv.check``); returns (model, tokenizer)."""
    from agentenv_nb.train.model import loading

    model, tokenizer = loading.load_model(run.model, preset, "sft", corpus=loading.corpus(start.demonstrations),
                                          models_dir=f"{run.run_dir}/models")
    env.check(tokenizer)
    return model, tokenizer


def greedy_eval(run: SFTRun, preset, model, tokenizer, env, progress: bool = True) -> list:
    """The first EVAL_DAYS eval tasks played greedily, the preset's eval batch at a time; returns the rollouts
    (``rollout.summary`` scores them)."""
    from agentenv_nb.train.rollout import play

    return play(model, tokenizer, env.factory, env.dataset_for("eval", first=run.eval_days),
                batch_size=preset.per_device_eval_batch_size, max_new_tokens=run.max_new_tokens, progress=progress)


def train(run: SFTRun, preset, model, tokenizer, env, start, callbacks=(), **overrides):
    """TRL's SFTTrainer on ``start``'s demonstrations that ``model`` can learn from (loss on the assistant's tokens
    only), with ``preset``'s SFT settings for this model, SFT_STEPS and ``overrides`` (SFTConfig settings) over them,
    in RUN_DIR/sft-checkpoints; trained by ``fit``. Returns the trainer."""
    from agentenv_nb.train.fit import fit
    from agentenv_nb.train.warm_start.demos import sft_trainer

    trainer = sft_trainer(model, tokenizer, start.sft_dataset(model, tokenizer, env, preset,
                                                              max_new_tokens=run.max_new_tokens),
                          preset, callbacks, output_dir=f"{run.run_dir}/sft-checkpoints",
                          **{"max_steps": run.sft_steps, **overrides})
    fit(trainer)
    return trainer


def save(run: SFTRun, model, tokenizer) -> str:
    """The warm start saved in RUN_DIR/sft (``loading.save_warm_start``: the adapter, the merged model notebook 03
    loads); returns the merged model's folder."""
    from agentenv_nb.train.model import loading

    return loading.save_warm_start(model, tokenizer, f"{run.run_dir}/sft")


def distill(run: SFTRun, preset, model, tokenizer, env, scored: dict, callbacks=()) -> None:
    """DISTILL_ROUNDS rounds of self-distillation (``demos.self_distill_round``, DISTILL_STEPS steps each), each said
    in a line with the eval reward after it against ``scored`` (the warm start's ``rollout.summary``); the model saved
    in RUN_DIR/distilled after the last, beside the warm start."""
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.rollout import summary
    from agentenv_nb.train.warm_start import demos

    for number in range(run.distill_rounds):
        rollouts, kept = demos.self_distill_round(model, tokenizer, env, preset, f"{run.run_dir}/distill-{number}",
                                                  max_steps=run.distill_steps, callbacks=list(callbacks),
                                                  batch_size=preset.per_device_eval_batch_size,
                                                  max_new_tokens=run.max_new_tokens)
        now = summary(greedy_eval(run, preset, model, tokenizer, env))
        print(f"round {number + 1}: {len(rollouts)} train rollouts scored {summary(rollouts)['reward']:.3f}, "
              f"fine-tuned on the best {len(kept)}; eval {scored['reward']:.3f} -> {now['reward']:.3f}")
    if run.distill_rounds:
        loading.save_warm_start(model, tokenizer, f"{run.run_dir}/distilled")
