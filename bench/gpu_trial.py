"""The trial step against the run it precedes: notebook 03's run as ``python -m agentenv_nb.train`` on a GPU held to
``--cap-gb``, the trial step's line ("fits: peak 19.1 of 24.0 GB; about 5 s a step, ...") against the same run's
measured steps (PyTorch's reserved peak over training, as the trial counts it; NVML's count of the whole process
beside it; TRL's ``step_time`` of each step); then a planted run that can't fit (``--planted``: GRPOConfig settings
over the preset's), which the trial step must stop before step 1 with its one line naming the setting to lower.

    python3 bench/gpu_trial.py --model MODEL --bundle BUNDLE --work DIR     # writes $OUT/trial.json

``MODEL``: the random Qwen3-4B-shaped folder (``train.model.tiny.build_random_qwen3_4b``), whose completions all run to
the budget, as the trial's worst case makes them. Goal: the estimate within 25% of the measured peak and median step.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

FITS = re.compile(r"fits: peak ([\d.]+) of ([\d.]+) GB; at most about ([\d.]+) (s|minutes|hours) a step")
TRAINED = re.compile(r"trained to step (\d+) of (\d+) in .*, peak GPU memory ([\d.]+) GiB")
STEP = re.compile(r"^step +\d+ \|.*\| ([\d.]+) s/step", re.MULTILINE)  # the run's progress line for each step
SECONDS = {"s": 1, "minutes": 60, "hours": 3600}


def own_gpu_mib(stop: threading.Event, into: dict) -> None:
    """The most GPU memory nvidia-smi counts for this process's children, each second, into ``into["mib"]``."""
    import psutil

    me = psutil.Process()
    while not stop.wait(1.0):
        children = {p.pid for p in me.children(recursive=True)}
        lines = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True).stdout.splitlines()
        used = sum(int(m) for p, m in (line.split(",") for line in lines) if int(p) in children)
        into["mib"] = max(into.get("mib", 0), used)


def command(args, run_dir: Path, steps: int, settings: list[str]) -> dict:
    """The training command on ``run_dir``, timed, its output kept in ``run_dir``.log; what it printed and used."""
    argv = [sys.executable, "-m", "agentenv_nb.train", "--bundle", args.bundle, "--warm-start", args.model,
            "--run-dir", str(run_dir), "--preset", args.preset, "--sandbox", "process", "--server-processes",
            str(args.server_processes), "--max-steps", str(steps), "--save-steps", "0", "--eval-days", "0",
            "--gguf", "", "--set=eval_strategy=no", "--set=eval_on_start=false", *(f"--set={s}" for s in settings)]
    env = {**os.environ, "AGENTENV_NB_GPU_MEMORY_GB": f"{args.cap_gb:g}", "PYTHONUNBUFFERED": "1",
           "AGENTENV_NB_LIBRARY_LOG": f"{run_dir}.library.log"}
    stop, gpu = threading.Event(), {}
    threading.Thread(target=own_gpu_mib, args=(stop, gpu), daemon=True).start()
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=args.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:  # where it hangs, each of its processes' Python stacks, then stopped
        Path(f"{run_dir}.stacks.txt").write_text(stacks(process.pid))
        process.kill()
        stdout, stderr = process.communicate()
        timed_out = True
    seconds = time.perf_counter() - start
    stop.set()
    Path(f"{run_dir}.log").write_text(stdout + "\n--- stderr ---\n" + stderr)
    return {"exit": process.returncode, "seconds": round(seconds, 1), "timed_out": timed_out, "stdout": stdout,
            "stderr": stderr, "nvidia_smi_peak_gib": gpu.get("mib", 0) / 1024}


def stacks(pid: int) -> str:
    """py-spy's dump of ``pid`` and its children (the stack carries py-spy, bench/gpu_machine.toml's ``extra``: its
    program in bin/ of the stack's folder on the path, where bench/gpu_stack.py puts wheels' scripts)."""
    import psutil

    spy = next((str(Path(p) / "bin" / "py-spy") for p in sys.path if (Path(p) / "bin" / "py-spy").exists()),
               shutil.which("py-spy"))
    if spy is None:
        return "py-spy is not installed: no stacks"
    pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    dumps = [subprocess.run([spy, "dump", "--pid", str(each)], capture_output=True, text=True, timeout=60)
             for each in pids]
    return "\n".join(f"--- pid {each}\n{dump.stdout}{dump.stderr}" for each, dump in zip(pids, dumps))


def fits(args) -> dict:
    """The trial's estimate against the run's steps."""
    run_dir = Path(args.work) / "fits"
    ran = command(args, run_dir, args.steps, [])
    trial, trained = FITS.search(ran["stdout"]), TRAINED.search(ran["stdout"])
    state = run_dir / "grpo" / "trainer_state.json"
    # the trainer's state is saved at the end; a run stopped before it has its progress lines
    steps = [log["step_time"] for log in json.loads(state.read_text())["log_history"] if "step_time" in log] \
        if state.exists() else [float(seconds) for seconds in STEP.findall(ran["stdout"])]
    report = {"exit": ran["exit"], "seconds": ran["seconds"], "trial_line": trial and trial.group(0),
              "step_times_s": steps, "nvidia_smi_peak_gib": ran["nvidia_smi_peak_gib"],
              "stderr_tail": ran["stderr"][-3000:] if ran["exit"] else ""}
    if trial and trained and steps:
        estimate_gb, step_s = float(trial.group(1)), float(trial.group(3)) * SECONDS[trial.group(4)]
        measured_gb = float(trained.group(3)) * 2**30 / 1e9
        median = statistics.median(steps[1:] or steps)
        report.update(estimate_peak_gb=estimate_gb, measured_peak_gb=round(measured_gb, 2),
                      peak_ratio=round(estimate_gb / measured_gb, 3), estimate_step_s=step_s,
                      measured_median_step_s=round(median, 2), step_ratio=round(step_s / median, 3))
        report["within_25_percent"] = all(0.75 <= report[k] <= 1.25 for k in ("peak_ratio", "step_ratio"))
    return report


def planted(args) -> dict:
    """A run that can't fit: stopped by the trial step, before step 1, with its line."""
    run_dir = Path(args.work) / "planted"
    ran = command(args, run_dir, args.steps, args.planted)
    lines = [line for line in ran["stdout"].splitlines() + ran["stderr"].splitlines() if "doesn't fit" in line]
    trained = (run_dir / "grpo" / "trainer_state.json").exists() or any((run_dir / "grpo").glob("checkpoint-*"))
    return {"settings": args.planted, "exit": ran["exit"], "seconds": ran["seconds"], "timed_out": ran["timed_out"],
            "line": lines[-1] if lines
            else None, "trained_a_step": trained, "stopped_before_step_1": ran["exit"] == 2 and bool(lines)
            and not trained, "traceback": "Traceback" in ran["stderr"] + ran["stdout"],
            "stderr_tail": "" if lines else ran["stderr"][-3000:]}


RUNS = {"fits": fits, "planted": planted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--work", required=True, help="the runs' folders and logs")
    parser.add_argument("--preset", default="24gb")
    parser.add_argument("--cap-gb", type=float, default=24.0, help="the GPU held to this many GB (1e9 bytes)")
    parser.add_argument("--steps", type=int, default=4, help="the fitting run's steps, the first left out of the median")
    parser.add_argument("--server-processes", type=int, default=4)
    # 3,072 with the longest prompt stays within "24gb"'s max_seq_length of 4,096, so memory, not the length check
    # (trial.length_problem), is what stops it: 32 rollouts of it a micro-batch are 12x the preset's tokens (8 of 1,024)
    parser.add_argument("--planted", nargs="*", default=["max_completion_length=3072", "per_device_train_batch_size=32",
                                                         "gradient_accumulation_steps=1"])
    parser.add_argument("--timeout-s", type=float, default=600.0, help="each run stopped after this long")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which of the two runs, in order")
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = {"preset": args.preset, "cap_gb": args.cap_gb, **{run: RUNS[run](args) for run in args.runs}}
    out = Path(os.environ.get("OUT") or args.work)
    (out / "trial.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
