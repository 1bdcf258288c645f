"""``python -m agentenv_nb.train``: notebook 03's GRPO run as a command, which ``torchrun`` or ``accelerate launch``
starts on N GPUs as data parallel (docs/scale-out.md).

    python -m agentenv_nb.train --run-dir runs/gridsim                        # one GPU, as notebook 03
    torchrun --nproc_per_node 2 -m agentenv_nb.train --run-dir runs/gridsim   # two GPUs, one model copy each
    accelerate launch --num_processes 2 -m agentenv_nb.train --env-url http://env-host:8000 --max-concurrent-envs 128

The same parameters and building blocks as the notebook: ``loading.load_model``, ``presets.trainer_config``,
``AgentEnv``, ``train.grpo.trainer.trainer_for`` (``--trainer``: TRL's GRPOTrainer, or Unsloth's AsyncGRPOTrainer on one GPU)
with ``env.metrics`` and the console live view, ``fit`` (which resumes from the run's last checkpoint). Each rank
trains on its own rows of every generation batch on its own GPU, with its own vLLM engine where the preset generates
on vLLM, sized and capped on that GPU (``launch``, ``vllm_sizing``); rank 0 serves the envs for all ranks (``ranks``),
prints the live view, and writes the metrics and checkpoints (transformers' Trainer saves on the main process only). A
launch that can't run (FSDP with vLLM, fewer GPUs than processes, the async trainer without vLLM or on several
processes) is refused first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from agentenv_nb import settings
from agentenv_nb.train import earlier_steps
from agentenv_nb.train.export import hub_problem
from agentenv_nb.train.grpo.launch import ASYNC_EVALS, launch_problem
from agentenv_nb.train.presets import AUTO, PRESETS
from agentenv_nb.train.grpo.run import SANDBOXES, TRAINERS, GRPORun
from agentenv_nb.train.tracking import REPORT_TO, report_to_problem

PROG = "python -m agentenv_nb.train"


class UsageError(Exception):
    """What the user asked for can't run; the message says what to change."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def parser() -> argparse.ArgumentParser:
    """The command's options: notebook 03's parameters (``GRPORun``), with its defaults, and where the envs are
    served."""
    p = _OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""),
                       epilog="Launch on N GPUs with `torchrun --nproc_per_node N -m agentenv_nb.train ...` or "
                              "`accelerate launch --num_processes N -m agentenv_nb.train ...`; docs/scale-out.md.")
    _option(p, "bundle")
    _option(p, "bundles_dir")
    _option(p, "run_dir")
    _option(p, "warm_start")
    _option(p, "preset", choices=(AUTO, *PRESETS))
    _option(p, "trainer", choices=TRAINERS)
    _option(p, "sandbox", choices=SANDBOXES)
    _option(p, "max_steps", type=_positive)
    _option(p, "save_steps", type=_counting)
    p.add_argument("--max-concurrent-envs", type=_positive, help="sessions the env servers hold in all; default: "
                   "sized for every rank: the larger of a step's rollouts and an eval batch, every rank's")
    _option(p, "server_processes", type=_counting)  # rank 0's, for every rank
    _option(p, "reward")  # a name or a step id: reaches the server processes as notebook 03's does
    _option(p, "toolsets", choices=("first", "each"))
    p.add_argument("--env-url", action="append", metavar="URL", help="play envs served elsewhere (python -m "
                   "agentenv_nb.envs.serve on an env host) instead of serving here; repeat for several servers")
    _option(p, "report_to", choices=REPORT_TO)
    _option(p, "gguf", metavar="QUANT")  # beside the adapter and the merged model in RUN_DIR/trained
    _option(p, "build_llama_cpp", action="store_true")
    _option(p, "push_to_hub", metavar="OWNER/NAME")
    _option(p, "eval_days", type=_counting)  # rank 0's, after training, into RUN_DIR/greedy-evals.csv
    _option(p, "max_new_tokens", type=_positive)
    p.add_argument("--set", action="append", default=[], type=_setting, metavar="KEY=VALUE", dest="overrides",
                   help="a GRPOConfig setting over the preset's, VALUE as JSON (else a string); e.g. "
                        "steps_per_generation=1 where the card has the room; repeatable")
    return p


def _option(p: argparse.ArgumentParser, name: str, **given) -> None:
    """``--name`` with notebook 03's default and help for the parameter ``name``, unless ``given`` says otherwise."""
    default = given.pop("default", getattr(GRPORun(), name))
    text = given.pop("help", GRPORun.help(name)).replace("%", "%%")
    shown = f" (default: {default})" if default not in (None, "") else ""
    p.add_argument(f"--{name.replace('_', '-')}", default=default, help=text + shown, **given)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _counting(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 0")
    return int(text)


def _setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def warm_start(args) -> str:
    """The model to train (``earlier_steps.warm_start``); else UsageError saying what to pass."""
    if problem := earlier_steps.warm_start_problem(args.run_dir, args.warm_start):
        raise UsageError(problem.replace("WARM_START=", "--warm-start ").replace("set WARM_START to",
                                                                                 "pass --warm-start:"))
    return earlier_steps.warm_start(args.run_dir, args.warm_start)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        try:  # every path reads them later, some only after Unsloth loads (seconds): a bad one is said first
            settings.check_environment()
        except settings.SettingError as error:
            raise UsageError(str(error)) from None
        if problem := report_to_problem(args.report_to):
            raise UsageError(problem.replace("REPORT_TO=", "--report-to "))
        if problem := hub_problem(args.push_to_hub):
            raise UsageError(problem.replace("PUSH_TO_HUB=", "--push-to-hub ").replace("leave PUSH_TO_HUB empty",
                                                                                   "leave --push-to-hub out"))
        model_name = warm_start(args)
        # FSDP with vLLM, a GPU short, the async trainer without vLLM or on several processes
        if problem := launch_problem(args.preset, dict(args.overrides), args.trainer):
            raise UsageError(problem.replace("the 'grpo' trainer", "--trainer grpo"))
        serving = None if args.env_url or os.environ.get("RANK", "0") != "0" else where_to_serve(args)
        train(args, model_name, serving)
    except UsageError as error:
        rank = os.environ.get("RANK")
        print(f"{PROG}: error{f' (rank {rank})' if rank not in (None, '0') else ''}: {error}", file=sys.stderr)
        return 2
    return 0


def where_to_serve(args):
    """The bundle resolved (``envs.resolve``: fetched if need be, its sandbox chosen, its envs checked) on the process
    that will serve it, before anything slow starts: an unknown bundle or an impossible sandbox is said at once."""
    from agentenv_nb.envs.choice import SandboxError
    from agentenv_nb.envs.resolve import resolve
    from agentenv_nb.tasks import bundles

    try:
        return resolve(args.bundle, None if args.sandbox == "auto" else args.sandbox, bundle_dir=args.bundles_dir)
    except (bundles.UnknownBundle, SandboxError, ValueError, RuntimeError) as error:  # ValueError: a bad setting
        raise UsageError(str(error)) from None


def train(args, model_name: str, serving) -> None:
    """Notebook 03's cells on this rank: configure, serve (rank 0) or connect, load, train, save the state, and
    (rank 0) export the trained model."""
    from agentenv_nb.host.plan import say_plan
    from agentenv_nb.stack import import_unsloth

    say_plan()  # what this host installs and trains with, as the notebooks' set-up cell and preflight say it
    import_unsloth()  # first, so Unsloth patches transformers and TRL before anything uses them
    from accelerate import PartialState

    from agentenv_nb.train import presets

    # The config first: making it joins torchrun's or accelerate's process group (on a CPU too, with gloo)
    config = presets.trainer_config(args.trainer, args.preset, output_dir=f"{args.run_dir}/grpo",
                                    max_steps=args.max_steps, save_steps=args.save_steps, resume=True,
                                    model_name=model_name, **dict(args.overrides))
    state = PartialState()
    with contextlib.ExitStack() as quiet:
        if not state.is_main_process:  # rank 0 speaks for the run; the others' warnings and errors still reach stderr
            quiet.enter_context(contextlib.redirect_stdout(quiet.enter_context(open(os.devnull, "w"))))
        _train(args, model_name, serving, config, state)


def _train(args, model_name: str, serving, config, state) -> None:
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.export import export_model
    from agentenv_nb.train.grpo.trainer import trainer_for
    from agentenv_nb.train.grpo import trial
    from agentenv_nb.train.fit import fit
    from agentenv_nb.train.live import ConsoleLivePlot
    from agentenv_nb.train.grpo.ranks import close_for_ranks, envs_for_ranks
    from agentenv_nb.train.rollout import greedy_evals, play, summary
    from agentenv_nb.tasks.bundles import toolset_count
    from agentenv_nb.train.grpo.sessions import capacity_problem, sessions_needed

    if args.trainer == "async":
        print(ASYNC_EVALS + ("" if args.eval_days else ", and --eval-days 0 plays none"))
    toolsets = toolset_count(serving.folder, args.toolsets) if serving else 1  # a pool of environments each
    # rank 0's greedy eval after training plays an eval batch while the trainer's environments hold their sessions
    beside = min(args.eval_days, config.per_device_eval_batch_size)
    needed = sessions_needed(config, toolsets, beside=beside)
    limit = args.max_concurrent_envs or (None if args.env_url else needed)
    if limit is None:
        print(f"the env servers' session limit wasn't given, so it isn't checked: {state.num_processes} rank(s) open "
              f"up to {needed} sessions at once (--max-concurrent-envs to check)")
    elif problem := capacity_problem(config, limit, toolsets, beside=beside):
        raise UsageError(problem)
    else:
        print(f"{state.num_processes} process(es) open up to {needed} env sessions at once; the env servers hold "
              f"{limit}")
    try:
        env = envs_for_ranks(state, lambda: _serve(args, serving, limit), urls=args.env_url)
    except ConnectionError as error:  # an --env-url where no env server answers
        raise UsageError(str(error)) from None
    try:
        model, tokenizer = loading.load_model(model_name, args.preset)
        env.check(tokenizer)
        live = [ConsoleLivePlot()] if state.is_main_process else []  # the others' logs are the same numbers
        trainer = trainer_for(model, tokenizer, config, env, callbacks=[env.metrics, *live])  # --trainer's
        if state.num_processes == 1:  # a trial trainer beside the run's isn't tried across ranks yet
            print(trial.check(model, tokenizer, config, env, args.preset))  # the longest step first: fits? how long?
        fit(trainer, report_to=args.report_to)  # resumes from the last checkpoint, and never past --max-steps
        trainer.save_state()  # trainer_state.json, with every log: on the main process only
        if state.is_main_process and args.eval_days:  # as notebook 03 scores the trained model
            played = play(trainer.model, tokenizer, env.factory, env.dataset_for("eval", first=args.eval_days),
                          batch_size=config.per_device_eval_batch_size, max_new_tokens=args.max_new_tokens)
            scored = greedy_evals(args.run_dir, {"after GRPO": summary(played)})["after GRPO"]
            print(f"greedy eval on {len(played)} eval tasks: "
                  f"reward {scored['reward']:.3f} ± {scored['reward_std']:.3f}, "
                  f"tool-call rate {scored['tool_call_rate']:.3f} (in {args.run_dir}/greedy-evals.csv)")
        if state.is_main_process:
            export_model(trainer.model, tokenizer, f"{args.run_dir}/trained", gguf=args.gguf,
                         push_to_hub=args.push_to_hub, build_llama_cpp=args.build_llama_cpp)
    except BaseException:
        env.close()
        raise
    close_for_ranks(state, env)
    print(f"{state.num_processes} process(es) trained to step {trainer.state.global_step}; checkpoints and logs in "
          f"{config.output_dir}")


def _serve(args, serving, limit: int):
    """Rank 0's servers for every rank: the resolved bundle served from ``--server-processes`` processes, holding
    ``limit`` sessions, as notebook 03."""
    from dataclasses import replace

    from agentenv_nb import AgentEnv

    return AgentEnv.local(replace(serving, max_concurrent_envs=limit), split="train",
                          processes=args.server_processes, reward=args.reward or None, toolsets=args.toolsets)
