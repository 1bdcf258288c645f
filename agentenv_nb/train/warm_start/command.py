"""``python -m agentenv_nb.train sft``: notebook 02's SFT warm start as a command, which saves the model the GRPO
command (``python -m agentenv_nb.train``) trains from.

    python -m agentenv_nb.train sft --run-dir runs/gridsim --model unsloth/Qwen3-4B
    python -m agentenv_nb.train sft --model tiny --preset cpu-tiny --distill-rounds 0   # the offline CPU model

The same parameters (``SFTRun``) and steps as the notebook (``train.warm_start.run``: the preset, the bundle served,
the demonstrations chosen, the model loaded and checked, the greedy eval before and after, TRL's SFTTrainer through
``fit``, the warm start saved and checked, the self-distillation rounds), with the console live view; this module adds
only the options.
"""

from __future__ import annotations

import sys

from agentenv_nb.stops import Stop
from agentenv_nb.train.options import Options, UsageError, check_settings, counting, positive, setting
from agentenv_nb.train.presets import AUTO, PRESETS
from agentenv_nb.train.run import SANDBOXES, serve, where_to_serve
from agentenv_nb.train.warm_start import run as sft_run
from agentenv_nb.train.warm_start.run import SFTRun

PROG = "python -m agentenv_nb.train sft"


def options() -> Options:
    """The command's options: notebook 02's parameters (``SFTRun``), with its defaults."""
    options = Options(SFTRun, prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""))
    options.add("bundle")
    options.add("bundles_dir")
    options.add("run_dir")
    options.add("sandbox", choices=SANDBOXES)
    options.add("server_processes", type=counting)
    options.add("reward")
    options.add("toolsets", choices=("first", "each"))
    options.add("model")
    options.add("preset", choices=(AUTO, *PRESETS))
    options.group("preset").add_argument(
        "--set", action="append", default=[], type=setting, metavar="KEY=VALUE", dest="overrides",
        help="an SFTConfig setting over the preset's, VALUE as JSON (else a string); e.g. max_steps=20; repeatable")
    options.add("demos", metavar="JSONL")
    options.add("sft_steps", type=positive)
    options.add("eval_days", type=counting)
    options.add("max_new_tokens", type=positive)
    options.add("distill_rounds", type=counting)
    options.add("distill_steps", type=positive)
    return options


def main(argv: list[str] | None = None) -> int:
    args, run = options().parse(argv)
    try:
        check_settings()
        warm_start(run, sft_run.run_preset(run), where_to_serve(run), dict(args.overrides))
    except (UsageError, Stop) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


def warm_start(run: SFTRun, preset, bundle, overrides: dict) -> str:
    """Notebook 02's steps, in its order, on ``bundle`` (resolved); returns the warm start's folder."""
    from agentenv_nb.host.plan import say_plan
    from agentenv_nb.stack import import_unsloth

    say_plan()  # what this host installs and trains with, as the notebooks' set-up cell and preflight say it
    import_unsloth()  # first, so Unsloth patches transformers and TRL before anything uses them
    from agentenv_nb.train.live import ConsoleLivePlot
    from agentenv_nb.train.naming import COMMAND
    from agentenv_nb.train.rollout import greedy_evals, summary
    from agentenv_nb.train.warm_start.sources import check_learned

    with serve(run, bundle, sft_run.session_limit(run, preset, bundle)) as env:
        start = sft_run.demonstrations(run, bundle, env)
        model, tokenizer = sft_run.load(run, preset, start, env)
        before = summary(sft_run.greedy_eval(run, preset, model, tokenizer, env))
        sft_run.train(run, preset, model, tokenizer, env, start, callbacks=[ConsoleLivePlot()], **overrides)
        after = summary(sft_run.greedy_eval(run, preset, model, tokenizer, env))
        print(greedy_evals(run.run_dir, {"before SFT": before, "after SFT": after}).round(3).to_string())
        saved = sft_run.save(run, model, tokenizer)
        print(f"the warm start is in {saved}; `python -m agentenv_nb.train --run-dir {run.run_dir}` trains GRPO "
              "from it")
        check_learned(after, preset, COMMAND)
        sft_run.distill(run, preset, model, tokenizer, env, after, callbacks=[ConsoleLivePlot()])
    return saved
