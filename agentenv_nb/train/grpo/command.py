"""``python -m agentenv_nb.train``: notebook 03's GRPO run as a command, which ``torchrun`` or ``accelerate launch``
starts on N GPUs as data parallel (docs/scale-out.md).

    python -m agentenv_nb.train --run-dir runs/gridsim                        # one GPU, as notebook 03
    torchrun --nproc_per_node 2 -m agentenv_nb.train --run-dir runs/gridsim   # two GPUs, one model copy each
    accelerate launch --num_processes 2 -m agentenv_nb.train --env-url http://env-host:8000 --max-concurrent-envs 128

The same parameters (``GRPORun``) and steps as the notebook (``train.grpo.run``: the preset and config, the bundle
served with the sessions the run needs, the model loaded and checked, the trial step, ``fit``, which resumes from the
run's last checkpoint, the greedy eval and the export), with the console live view; this module adds only the options
and the ranks. ``--trainer``: TRL's GRPOTrainer, or Unsloth's AsyncGRPOTrainer on one GPU. Each rank
trains on its own rows of every generation batch on its own GPU, with its own vLLM engine where the preset generates
on vLLM, sized and capped on that GPU (``launch``, ``vllm_sizing``); rank 0 serves the envs for all ranks (``ranks``),
prints the live view, and writes the metrics and checkpoints (transformers' Trainer saves on the main process only). A
launch that can't run (FSDP with vLLM, fewer GPUs than processes, the async trainer without vLLM or on several
processes) is refused first.
"""

from __future__ import annotations

import contextlib
import os
import sys

from agentenv_nb.stops import Stop
from agentenv_nb.train import earlier_steps
from agentenv_nb.train.export import hub_problem
from agentenv_nb.train.grpo.launch import ASYNC_EVALS, launch_problem
from agentenv_nb.train.grpo import run as grpo_run
from agentenv_nb.train.grpo.run import GRPORun
from agentenv_nb.train.naming import COMMAND
from agentenv_nb.train.options import (Options, UsageError, check_settings, counting, positive, positive_number,
                                       setting)
from agentenv_nb.train.presets import AUTO, PRESETS, TRAINERS
from agentenv_nb.train.run import SANDBOXES, serve, where_to_serve
from agentenv_nb.train.tracking import REPORT_TO, report_to_problem

PROG = "python -m agentenv_nb.train"


def options() -> Options:
    """The command's options: notebook 03's parameters (``GRPORun``), with its defaults, and where the envs are
    served."""
    options = Options(GRPORun, prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""),
                      epilog="Launch on N GPUs with `torchrun --nproc_per_node N -m agentenv_nb.train ...` or "
                             "`accelerate launch --num_processes N -m agentenv_nb.train ...`; docs/scale-out.md. "
                             "Notebook 02's SFT warm start: `python -m agentenv_nb.train sft --help`.")
    options.add("bundle")
    options.add("bundles_dir")
    options.add("run_dir")
    options.add("sandbox", choices=SANDBOXES)
    options.add("server_processes", type=counting)  # rank 0's, for every rank
    options.add("reward")  # a name or a step id: reaches the server processes as notebook 03's does
    options.add("toolsets", choices=("first", "each"))
    envs = options.group("sandbox")
    envs.add_argument("--env-url", action="append", metavar="URL", help="play envs served elsewhere (python -m "
                      "agentenv_nb.envs.serve on an env host) instead of serving here; repeat for several servers")
    envs.add_argument("--max-concurrent-envs", type=positive, help="with --env-url: the sessions those servers hold "
                      "in all, checked against the run's need (served here, the servers are sized from the config)")
    options.add("warm_start")
    options.add("preset", choices=(AUTO, *PRESETS))
    options.add("trainer", choices=TRAINERS)
    options.add("max_steps", type=positive)
    options.add("learning_rate", type=positive_number)
    options.add("temperature", type=positive_number)
    options.add("lora_rank", type=positive)
    options.add("rollouts_a_step", type=positive)
    options.add("num_generations", type=positive)
    options.add("save_steps", type=counting)
    options.group("max_steps").add_argument(
        "--set", action="append", default=[], type=setting, metavar="KEY=VALUE", dest="overrides",
        help="a GRPOConfig setting over the preset's, VALUE as JSON (else a string); e.g. steps_per_generation=1 "
             "where the card has the room; repeatable")
    options.add("report_to", choices=REPORT_TO)
    options.add("gguf", metavar="QUANT")  # beside the adapter and the merged model in RUN_DIR/trained
    options.add("build_llama_cpp", action="store_true")
    options.add("push_to_hub", metavar="OWNER/NAME")
    options.add("eval_days", type=counting)  # rank 0's, after training, into RUN_DIR/greedy-evals.csv
    options.add("max_new_tokens", type=positive)
    return options


def main(argv: list[str] | None = None) -> int:
    args, run = options().parse(argv)
    try:
        check_settings()
        if args.max_concurrent_envs and not args.env_url:
            raise UsageError("--max-concurrent-envs is for servers elsewhere (--env-url): the servers this command "
                             "starts hold the sessions the run's config needs, every rank's")
        problem = (report_to_problem(run.report_to, COMMAND) or hub_problem(run.push_to_hub, COMMAND)
                   or earlier_steps.warm_start_problem(run.run_dir, run.warm_start, COMMAND))
        if problem:
            raise UsageError(problem)
        settings = dict(args.overrides)
        # "auto": the card's, said in a line; resolved once, with the --set settings that size it, handed down
        preset = grpo_run.run_preset(run, COMMAND, settings)
        # FSDP with vLLM, a GPU short, the async trainer without vLLM or on several processes
        if problem := launch_problem(preset, settings, run.trainer, COMMAND):
            raise UsageError(problem)
        model_name = earlier_steps.warm_start(run.run_dir, run.warm_start)
        bundle = None if args.env_url or os.environ.get("RANK", "0") != "0" else where_to_serve(run)
        train(run, args, preset, model_name, bundle)
    except (UsageError, Stop) as error:
        rank = os.environ.get("RANK")
        print(f"{PROG}: error{f' (rank {rank})' if rank not in (None, '0') else ''}: {error}", file=sys.stderr)
        return 2
    return 0


def train(run: GRPORun, args, preset, model_name: str, bundle) -> None:
    """Notebook 03's steps on this rank: configure, serve (rank 0) or connect, load, train, save the state, and
    (rank 0) the greedy eval and the export."""
    from agentenv_nb.host.plan import say_plan
    from agentenv_nb.stack import import_unsloth

    say_plan()  # what this host installs and trains with, as the notebooks' set-up cell and preflight say it
    import_unsloth()  # first, so Unsloth patches transformers and TRL before anything uses them
    from accelerate import PartialState

    # The config first: making it joins torchrun's or accelerate's process group (on a CPU too, with gloo)
    config = grpo_run.run_config(run, preset, model_name, **dict(args.overrides))
    state = PartialState()
    with contextlib.ExitStack() as quiet:
        if not state.is_main_process:  # rank 0 speaks for the run; the others' warnings and errors still reach stderr
            quiet.enter_context(contextlib.redirect_stdout(quiet.enter_context(open(os.devnull, "w"))))
        _train(run, args, preset, model_name, bundle, config, state)


def _sessions(run: GRPORun, args, bundle, config, state) -> int | None:
    """The sessions rank 0's servers hold (``run.session_limit``), said in a line; or, playing servers elsewhere,
    None, their limit (``--max-concurrent-envs``) checked against the run's need where it is given."""
    from agentenv_nb.train.sessions import capacity_problem, sessions_needed

    if bundle is not None:
        limit = grpo_run.session_limit(run, config, bundle)
        print(f"{state.num_processes} process(es) open up to {limit} env sessions at once; the env servers hold that")
        return limit
    beside = grpo_run.greedy_eval_sessions(run, config)
    if args.env_url and args.max_concurrent_envs:
        if problem := capacity_problem(config, args.max_concurrent_envs, beside=beside):
            raise UsageError(problem)
    elif args.env_url:
        print(f"the env servers' session limit wasn't given, so it isn't checked: {state.num_processes} rank(s) open "
              f"up to {sessions_needed(config, beside=beside)} sessions at once (--max-concurrent-envs to check)")
    return None


def _train(run: GRPORun, args, preset, model_name: str, bundle, config, state) -> None:
    from agentenv_nb.train.grpo.ranks import close_for_ranks, envs_for_ranks
    from agentenv_nb.train.live import ConsoleLivePlot

    if run.trainer == "async":
        print(ASYNC_EVALS + ("" if run.eval_days else ", and --eval-days 0 plays none"))
    limit = _sessions(run, args, bundle, config, state)
    try:
        env = envs_for_ranks(state, lambda: serve(run, bundle, limit), urls=args.env_url)
    except ConnectionError as error:  # an --env-url where no env server answers
        raise UsageError(str(error)) from None
    try:
        model, tokenizer = grpo_run.load(preset, model_name, env)
        live = [ConsoleLivePlot()] if state.is_main_process else []  # the others' logs are the same numbers
        # a trial trainer beside the run's isn't tried across ranks yet
        trainer = grpo_run.train(run, preset, model, tokenizer, config, env, live, trial=state.num_processes == 1)
        if state.is_main_process and run.eval_days:  # as notebook 03 scores the trained model
            played, greedy = grpo_run.greedy_eval(run, trainer.model, tokenizer, env, config)
            scored = greedy["after GRPO"]  # summarised once, by greedy_eval
            print(f"greedy eval on {len(played)} eval tasks: "
                  f"reward {scored['reward']:.3f} ± {scored['reward_std']:.3f}, "
                  f"tool-call rate {scored['tool_call_rate']:.3f} (in {run.run_dir}/greedy-evals.csv)")
        if state.is_main_process:
            grpo_run.export(run, trainer.model, tokenizer, COMMAND)
    except BaseException:
        env.close()
        raise
    close_for_ranks(state, env)
    print(f"{state.num_processes} process(es) trained to step {trainer.state.global_step}; checkpoints and logs in "
          f"{config.output_dir}")
