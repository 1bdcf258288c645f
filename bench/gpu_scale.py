"""One GPU against two: notebook 03's run as ``python -m agentenv_nb.train``, launched by ``torchrun`` on 1 and then
2 GPUs of one host, each GPU held to 24 GB (an L4's) by the kit (``AGENTENV_NB_GPU_MEMORY_GB``), the preset's
generation on each rank: Unsloth's vLLM where the stack has it (requirements-gpu.txt's), else transformers' generate.

Usage::

    python3 bench/gpu_scale.py --model MODEL --gpus 1 && python3 bench/gpu_scale.py --model MODEL --gpus 2
    python3 bench/gpu_scale.py --model MODEL --gpus 1,2 --steps 3   # both in one call, where its time allows
    python3 bench/gpu_scale.py --smoke                               # CPU plumbing: tiny model, cpu-tiny, gloo ranks

``MODEL``: a model folder, the random Qwen3-4B-shaped one (``train.model.tiny.build_random_qwen3_4b``), whose
completions all run to the preset's 1024 tokens: generation at its heaviest. Each launch trains ``--steps`` steps of the
preset (each rank: 32 rollouts a step, 1024 completion tokens, eval at the start, a checkpoint a step) on one GridSim
bundle served by rank 0 for every rank (``--server-processes`` processes), stopped after ``--timeout-s``. From each
run's ``trainer_state.json`` (or its last checkpoint's): the median step time of the steps after the first (TRL's
``step_time``: generation, envs and the update), rollouts a second (every rank's rollouts of a step over it), and
which steps the train and eval logs were written at (once each: rank 0's); from each rank: whether it generated on
vLLM, the share of its GPU vLLM was given, its peak memory (PyTorch's reserved, and the whole GPU's as nvidia-smi
counts it, vLLM's engine included). Results accumulate in ``--work`` (kept between launches, so two calls on one warm
machine make one table); prints markdown with the goals (2 GPUs >= 1.8x one's rollouts a second, each GPU within
``--cap-gb``), writes ``$OUT/scale.json``.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def worker(argv: list[str]) -> int:
    """One rank under torchrun: the training command, each GPU held to ``AGENTENV_NB_GPU_MEMORY_GB`` by the kit itself
    (no device set here first: the kit must find this rank's GPU on its own), and what the rank used: generation on
    vLLM or not, vLLM's share of its GPU, its peak memory (PyTorch's, and the whole GPU's, vLLM's engine included)."""
    from agentenv_nb.stack import import_unsloth

    import_unsloth()  # before measure imports transformers, as the command would have it
    import torch
    from measure import DevicePeak

    from agentenv_nb.train import presets
    from agentenv_nb.train.grpo import command
    from agentenv_nb.train.presets import vllm_sizing
    from agentenv_nb.train.presets.vllm_sizing import this_gpu

    args = command.options().parser.parse_args(argv)
    preset = presets.named(args.preset)
    kwargs = presets.grpo_kwargs(preset, **dict(args.overrides))
    cuda = torch.cuda.is_available()
    gpu = this_gpu() if cuda else None
    peak = DevicePeak(gpu) if cuda else None
    vllm = presets.fast_inference(preset)
    report = {"rank": int(os.environ.get("RANK", 0)), "world_size": int(os.environ.get("WORLD_SIZE", 1)), "gpu": gpu,
              "vllm": vllm, "rank_rollouts_per_step": kwargs["per_device_train_batch_size"] * kwargs[
                  "gradient_accumulation_steps"], "peak_reserved_gib": None, "peak_alloc_gib": None,
              "device_peak_gb": None}
    if cuda and vllm:  # what loading.load_model gives Unsloth's vLLM on this rank's GPU, of its card and cap
        report["vllm_gpu_memory_utilization"] = presets.model_kwargs(preset, args.warm_start)[
            "gpu_memory_utilization"]
        card, allowed = vllm_sizing.gpu_memory()
        report["card_gb"], report["allowed_gb"] = card / 1e9, allowed and allowed / 1e9
    written = Path(args.run_dir, f"rank{report['rank']}.json")
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(report))  # before training: a run stopped at its deadline still counts its steps
    code = command.main(argv)
    if cuda:
        report.update(peak_reserved_gib=torch.cuda.max_memory_reserved(gpu) / 2**30,
                      peak_alloc_gib=torch.cuda.max_memory_allocated(gpu) / 2**30, device_peak_gb=peak.peak / 1e9)
    written.write_text(json.dumps(report))
    return code


def launch(gpus: int, args, bundle: Path) -> dict:
    """``torchrun --nproc_per_node gpus -m agentenv_nb.train`` (through ``worker``) on a run folder of its own."""
    run_dir = Path(args.work) / f"run-{gpus}gpu"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus), __file__,
               "--worker", "--",
               "--bundle", str(bundle), "--run-dir", str(run_dir), "--warm-start", args.model, "--preset", args.preset,
               "--sandbox", "process", "--max-steps", str(args.steps), "--save-steps", "1",
               "--server-processes", str(args.server_processes), *(f"--set={pair}" for pair in args.set)]
    env = {**os.environ, **NVLINK_MULTICAST_OFF, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONUNBUFFERED": "1",
           "XDG_STATE_HOME": str(run_dir / "state")}
    if not args.smoke:  # NVML's order too, for each rank's whole-GPU peak
        env.update(CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    if args.cap_gb:
        env["AGENTENV_NB_GPU_MEMORY_GB"] = str(args.cap_gb)  # the kit holds each rank's GPU to it
    print(f"== {gpus} GPU(s): {' '.join(command)}", flush=True)
    start = time.perf_counter()
    launched = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: a deadline stops it all
    try:
        code = launched.wait(args.timeout_s)
    except subprocess.TimeoutExpired:
        code = f"stopped after {args.timeout_s:.0f} s"
        os.killpg(launched.pid, signal.SIGTERM)
        try:
            launched.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(launched.pid, signal.SIGKILL)
            launched.wait()
    result = {"gpus": gpus, "exit": code, "wall_s": time.perf_counter() - start}
    saved = sorted((run_dir / "grpo").glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
    state = run_dir / "grpo" / "trainer_state.json"
    state = state if state.exists() else (saved[-1] if saved else state)  # a stopped run: its last checkpoint
    if state.exists():
        logs = json.loads(state.read_text())["log_history"]
        steps = [log for log in logs if "loss" in log]
        times = [log["step_time"] for log in steps[1:] or steps]
        ranks = [json.loads(path.read_text()) for path in sorted(run_dir.glob("rank*.json"))]
        rollouts = sum(rank["rank_rollouts_per_step"] for rank in ranks)
        result.update(steps=len(steps), step_times=[log["step_time"] for log in steps],
                      steady_step_s=statistics.median(times), rollouts_per_step=rollouts,
                      rollouts_per_s=rollouts / statistics.median(times), train_logs=[log["step"] for log in steps],
                      eval_logs=[log["step"] for log in logs if "eval_reward" in log],
                      rewards=[log.get("reward") for log in steps],
                      peak_reserved_gib=[rank["peak_reserved_gib"] for rank in ranks],
                      device_peak_gb=[rank.get("device_peak_gb") for rank in ranks],
                      vllm=[rank.get("vllm") for rank in ranks], gpu_of_rank=[rank.get("gpu") for rank in ranks],
                      vllm_gpu_memory_utilization=[rank.get("vllm_gpu_memory_utilization") for rank in ranks],
                      checkpoints=sorted(path.name for path in (run_dir / "grpo").glob("checkpoint-*")))
    return result


def table(results: list[dict], cap_gb: float | None = None) -> str:
    """A row a launch; then the goals: two GPUs' rollouts a second against one's, each GPU's whole peak within
    ``cap_gb``."""
    rows = ["| GPUs | generation | steps | median step (s) | rollouts a step | rollouts/s | train logs at steps "
            "| eval logs at steps | vLLM's share of each GPU | peak reserved a GPU (GiB) | peak a GPU, whole (GB) "
            "| wall (s) |", "|" + "---|" * 12]
    listed = lambda values, form: ", ".join("-" if v is None else format(v, form) for v in values)  # noqa: E731
    for r in sorted(results, key=lambda r: r["gpus"]):
        if "steady_step_s" not in r:
            rows.append(f"| {r['gpus']} | | failed, exit {r['exit']} |" + " |" * 8 + f" {r['wall_s']:.0f} |")
            continue
        engines = set(r.get("vllm") or [])
        generation = "mixed" if len(engines) > 1 else "vLLM" if engines == {True} else "generate"
        rows.append(f"| {r['gpus']} | {generation} | {r['steps']} | {r['steady_step_s']:.1f} "
                    f"| {r['rollouts_per_step']} | {r['rollouts_per_s']:.2f} | {r['train_logs']} | {r['eval_logs']} "
                    f"| {listed(r.get('vllm_gpu_memory_utilization', []), '.4f')} "
                    f"| {listed(r['peak_reserved_gib'], '.1f')} | {listed(r.get('device_peak_gb', []), '.1f')} "
                    f"| {r['wall_s']:.0f} |")
    by_gpus = {r["gpus"]: r for r in results if "rollouts_per_s" in r}
    rows.append("")
    if 1 in by_gpus and 2 in by_gpus:
        ratio = by_gpus[2]["rollouts_per_s"] / by_gpus[1]["rollouts_per_s"]
        rows.append(f"- rollouts/s, 2 GPUs / 1 GPU: {ratio:.2f}x (goal >= 1.8x): {'PASS' if ratio >= 1.8 else 'FAIL'}")
    peaks = [p for r in by_gpus.values() for p in r.get("device_peak_gb") or [] if p is not None]
    if cap_gb and peaks:
        rows.append(f"- the most any GPU held, whole: {max(peaks):.1f} GB (goal <= {cap_gb:g}): "
                    f"{'PASS' if max(peaks) <= cap_gb else 'FAIL'}")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the model folder (the random Qwen3-4B-shaped one: "
                        "train.model.tiny.build_random_qwen3_4b)")
    parser.add_argument("--gpus", default="1,2", help="comma-separated GPU counts, launched in turn")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--preset", default="24gb", choices=("24gb", "16bit", "cpu-tiny"))
    parser.add_argument("--cap-gb", type=float, default=24.0, help="each GPU held to this many GB (1e9 bytes)")
    parser.add_argument("--server-processes", type=int, default=8)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to the command")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="a launch is stopped after this long")
    parser.add_argument("--work", default="/var/tmp/gpu-scale", help="bundle, runs and results, kept between calls")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing: tiny model, cpu-tiny, 1 step, gloo")
    args = parser.parse_args(argv)
    from agentenv_nb.tasks.gridsim import write_bundle

    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from agentenv_nb.train.model.tiny import build_tiny_model

        args.model = build_tiny_model(Path(args.work) / "tiny")
        args.preset, args.steps, args.cap_gb, args.server_processes = "cpu-tiny", 2, None, 0
        args.set = [*args.set, "max_completion_length=64"]
    elif not args.model:
        parser.error("--model is required (or --smoke)")
    bundle = Path(args.work) / "gridsim"
    if not bundle.exists():
        write_bundle(bundle, train=64, eval=4)
    results_file = Path(args.work) / "results.json"
    results = {r["gpus"]: r for r in (json.loads(results_file.read_text()) if results_file.exists() else [])}
    for gpus in map(int, args.gpus.split(",")):
        results[gpus] = launch(gpus, args, bundle)
        results_file.write_text(json.dumps(list(results.values()), indent=1))
    out = Path(os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps({"preset": args.preset, "cap_gb": args.cap_gb, "steps": args.steps,
                                                "results": list(results.values())}, indent=1))
    print(f"\n## One GPU against two, {args.preset}, each GPU held to {args.cap_gb or 'all'} GB\n\n"
          f"{table(list(results.values()), args.cap_gb)}")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker(sys.argv[sys.argv.index("--") + 1:]))
    main()
