"""The measuring pieces the GPU benchmarks share (bench/gpu_grpo.py, gpu_sft.py, gpu_scale.py): a clock for timed
calls, a trainer callback splitting each step into generation, env and update with its peak memory, the device's peak
sampled on a thread, one variant run with its failure recorded, its steady summary, a markdown table, the JSON report,
and the cards' peak memory bandwidth and 16-bit arithmetic that bound a step's parts.

Import it after ``agentenv_nb.stack.import_unsloth()`` where Unsloth should patch transformers (it imports
``transformers.TrainerCallback``).
"""

import contextlib
import functools
import gc
import inspect
import json
import os
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

GIB, CUDA = 2**30, torch.cuda.is_available()
# What the trainer logs that a step's row keeps; the async trainer's own: the rollouts a step trained on (its token
# budget packs them, so not always per_device_train_batch_size x gradient_accumulation_steps), those waiting in its
# queue, and how long the step waited for one (0: the update, not generation, was what the step waited on)
LOGGED = ("tools/call_frequency", "completions/mean_length", "reward", "loss", "batch/samples_per_step",
          "sample/rollout_queue_size", "perf/rollout_wait_s")
# A synchronous GRPO step's parts beside generation, env and update (StepTimer), and what they handled: generation
# less vLLM's engine steps and the weight sync; the log-prob pass; the sync; the rest of the input preparation; the
# KV cache vLLM's decoding read (tokens), the tokens the log-prob pass scored and the update trained, the sync's bytes
PARTS = ("gen_rest_s", "logps_s", "sync_s", "rest_s", "kv_token_reads", "logps_tokens", "update_tokens", "sync_bytes")
# A card's peaks as torch names it: memory bandwidth (bytes/s) and dense 16-bit tensor arithmetic (FLOP/s: bf16, fp16
# on the T4, which has no bf16), from NVIDIA's datasheets, which give the 16-bit figure with sparsity, twice the dense
# one: nvidia.com/en-us/data-center/h100 (SXM5: 3.35 TB/s, 1,979 TFLOPS), .../h200 (4.8 TB/s, 1,979), .../l4 (300 GB/s,
# 242), .../a100 (40GB 1,555 GB/s, 80GB PCIe 1,935, 80GB SXM 2,039; 312 TFLOPS dense), .../tesla-t4 (320 GB/s, 65
# TFLOPS FP16 mixed precision, dense). A card not here gets no floor.
CARDS = {"NVIDIA H100 80GB HBM3": (3.35e12, 1979e12 / 2), "NVIDIA H200": (4.8e12, 1979e12 / 2),
         "NVIDIA L4": (300e9, 242e12 / 2), "NVIDIA A100-SXM4-40GB": (1555e9, 312e12),
         "NVIDIA A100-PCIE-40GB": (1555e9, 312e12), "NVIDIA A100 80GB PCIe": (1935e9, 312e12),
         "NVIDIA A100-SXM4-80GB": (2039e9, 312e12), "Tesla T4": (320e9, 65e12)}


def peaks() -> dict:
    """Peak GPU memory since the last reset, allocated and reserved, in GiB (nothing on a CPU)."""
    return {"peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB} if CUDA else {}


def cap_memory(cap_gb: float | None) -> None:
    """Hold this process to ``cap_gb`` GB (1e9 bytes) of the GPU, as if it were a smaller card."""
    if cap_gb and CUDA:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gb * 1e9 / torch.cuda.mem_get_info()[1]))


def free_memory(collect: bool = True) -> None:
    """Reset the peak memory counters, first freeing what nothing references any more (``collect``)."""
    if collect:
        gc.collect()
    if CUDA:
        torch.cuda.synchronize()
        if collect:
            torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class Clock:
    """Wall time spent inside timed calls, overlapping calls counted once, the number of calls, what they handled
    (``counts``: tokens, bytes), and (``sync``) the peak GPU memory allocated when the last call returned."""

    def __init__(self):
        self.total, self.calls, self._active, self._since, self._lock = 0.0, 0, 0, 0.0, threading.Lock()
        self.peak_gib, self.counts = None, Counter()

    def wrap(self, function, sync: bool = False, count=None):
        """``function`` timed on this clock, its name, docstring and signature kept (TRL reads tools by them);
        ``count(result, *args, **kwargs)``, where given, names the amounts a call handled, added up in ``counts``."""
        @functools.wraps(function)
        def timed(*args, **kwargs):
            with self._lock:
                if not self._active:
                    self._since = time.perf_counter()
                self._active, self.calls = self._active + 1, self.calls + 1
            try:
                result = function(*args, **kwargs)
            finally:
                if sync and CUDA:
                    torch.cuda.synchronize()
                    self.peak_gib = torch.cuda.max_memory_allocated() / GIB
                with self._lock:
                    self._active -= 1
                    if not self._active:
                        self.total += time.perf_counter() - self._since
            if count:
                amounts = count(result, *args, **kwargs)
                with self._lock:
                    self.counts.update(amounts)
            return result
        return timed

    def wrap_context(self, make, sync: bool = False):
        """``make``, a function giving a context manager, with that context's entry and exit timed on this clock, not
        the block run inside it."""
        @functools.wraps(make)
        @contextlib.contextmanager
        def timed(*args, **kwargs):
            context = make(*args, **kwargs)
            with contextlib.ExitStack() as stack:
                value = self.wrap(type(context).__enter__, sync)(context)
                stack.push(functools.partial(self.wrap(type(context).__exit__, sync), context))
                yield value
        return timed


def timed_class(cls: type, clock: Clock) -> type:
    """A subclass of ``cls`` whose reset, tools and get_reward run on ``clock``; its name, TRL's reward column's."""
    methods = {name: clock.wrap(function) for name, function in inspect.getmembers(cls, inspect.isfunction)
               if not name.startswith("_")}
    return type(cls.__name__, (cls,), {**methods, "__qualname__": cls.__qualname__, "__module__": cls.__module__})


class StepTimer(TrainerCallback):
    """Per optimizer step: wall time split into generation, env and update, peak GPU memory, logged metrics; and
    ``setup``, the time and peak memory before step 1. Where ``prepare`` times the trainer's input preparation (a
    synchronous GRPO step), the step's parts too (``PARTS``) and what the clocks counted. Stops after the step past
    ``budget_s`` of steady steps, counted from the first step's end (the first compiles, so a budget it alone would
    pass would leave no steady step); ``report`` gets steps. With ``profile_step``, torch.profiler records that step
    (its own overhead making it no steady step) and writes its operators and kernels by time to ``profile_path``."""

    def __init__(self, budget_s: float | None = None, fake_oom_step: int | None = None, report=None,
                 profile_step: int | None = None, profile_path: Path | None = None):
        self.gen, self.env, self.steps, self.setup, self._start = Clock(), Clock(), [], {}, time.perf_counter()
        self.update = Clock()  # timed only where generation overlaps the update (kit-async): its training steps
        # vLLM's engine steps inside generation (the synchronous variants): what generation spends in vLLM's forward
        # passes and sampling, against the rest of it (Unsloth's fold of the LoRA and its restore, or its LoRA load
        # for 4-bit weights; adding requests; TRL's parsing)
        self.engine = Clock()
        # A synchronous GRPO step's input preparation (TRL's _prepare_inputs: generation, env, rewards and the log-prob
        # pass; the rest of the step is the update), its log-prob pass and its weight sync into vLLM (inside generation)
        self.prepare, self.logps, self.sync = Clock(), Clock(), Clock()
        self.budget_s, self.fake_oom_step, self.report = budget_s, fake_oom_step, report
        self.profile_step, self.profile_path, self._profiler = profile_step, profile_path, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.setup = {"setup_s": time.perf_counter() - self._start, **{f"setup_{k}": v for k, v in peaks().items()}}
        self._start = time.perf_counter()
        self._begin = self._clocks()

    def _clocks(self) -> dict:
        """The time, each clock's total (``<name>_s``), the engine's steps and what the clocks counted, so far."""
        clocks = {"gen": self.gen, "env": self.env, "update": self.update, "engine": self.engine,
                  "prepare": self.prepare, "logps": self.logps, "sync": self.sync}
        return {"step_s": time.perf_counter(), **{f"{name}_s": clock.total for name, clock in clocks.items()},
                "engine_steps": self.engine.calls, **sum((clock.counts for clock in clocks.values()), Counter())}

    def on_step_begin(self, args, state, control, **kwargs):
        free_memory(collect=False)
        self.gen.peak_gib = None
        if self.profile_step == state.global_step + 1:
            activity = torch.profiler.ProfilerActivity
            self._profiler = torch.profiler.profile(activities=[activity.CPU, *([activity.CUDA] if CUDA else [])])
            self._profiler.start()

    def on_step_end(self, args, state, control, **kwargs):
        # A step runs from the last one's end: the trainer fetches its batch before on_step_begin, and the async
        # trainer's batch is its rollouts, which it may wait for (TRL's perf/rollout_wait_s)
        if CUDA:
            torch.cuda.synchronize()
        if profiled := self._profiler is not None:
            self._profiler.stop()
            write_profile(self._profiler, self.profile_path)
            self._profiler = None
        now = self._clocks()
        took = {key: value - self._begin.get(key, 0) for key, value in now.items()}
        self._begin = now
        step_s, gen, env, engine, engine_steps = (took[k] for k in ("step_s", "gen_s", "env_s", "engine_s",
                                                                    "engine_steps"))
        self.steps.append({"step": state.global_step, "step_s": step_s, "gen_s": gen, "env_s": env,
                           "update_s": took["update_s"] if self.update.calls else step_s - gen - env,
                           **({"engine_s": engine, "engine_steps": engine_steps,
                               "engine_ms": 1e3 * engine / max(engine_steps, 1)} if engine_steps else {}),
                           "env_pct": 100 * env / step_s, **({"profiled": True} if profiled else {}),
                           "gen_peak_alloc_gib": self.gen.peak_gib, **peaks()})
        if self.prepare.calls:  # the sync lies inside generation; the rest of the preparation: rewards, tokenising
            self.steps[-1].update({key: took[key] for key in PARTS if key in took},
                                  update_s=step_s - took["prepare_s"], gen_rest_s=gen - engine - took["sync_s"],
                                  rest_s=took["prepare_s"] - gen - env - took["logps_s"])
        if self.fake_oom_step == state.global_step:
            raise torch.OutOfMemoryError(f"simulated by --fake-oom after step {state.global_step}")
        if len(self.steps) == 1:
            self._start = time.perf_counter()
        control.should_training_stop |= bool(self.budget_s and time.perf_counter() - self._start > self.budget_s)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.steps and logs and self.steps[-1]["step"] == state.global_step:
            self.steps[-1].update({key: logs[key] for key in LOGGED if key in logs})
            if self.report:
                self.report(self.steps)



class DevicePeak:
    """The most GPU memory in use on the device (total less free, as nvidia-smi counts it: the whole process, vLLM,
    CUDA context and graphs included, and anything else on the GPU), and the most this process and its children use
    (NVML's per-process count, where NVML sees their pids), sampled on a thread every 50 ms since the last ``reset``.
    ``device``: the GPU's index (a rank's, ``vllm_sizing.this_gpu``); None, the current device's. NVML counts GPUs in PCI
    order: set CUDA_DEVICE_ORDER=PCI_BUS_ID where CUDA's order could differ."""

    def __init__(self, device: int | None = None):
        self.peak, self.own_peak = 0, None
        # here, not in the thread: a thread's current device is GPU 0, whatever this thread set
        self.device = device if device is not None or not CUDA else torch.cuda.current_device()
        if CUDA:
            threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        own = self._own_usage(self.device)
        while True:
            free, total = torch.cuda.mem_get_info(self.device)
            self.peak = max(self.peak, total - free)
            if (used := own()) is not None:
                self.own_peak = max(self.own_peak or 0, used)
            time.sleep(0.05)

    @staticmethod
    def _own_usage(device: int):
        """A function giving the GPU memory NVML counts for this process and its children on ``device``, or None."""
        try:
            import psutil
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        except Exception:  # no NVML: the device's count stands alone
            return lambda: None
        me = psutil.Process()

        def used():
            pids = {me.pid, *(child.pid for child in me.children(recursive=True))}
            seen = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
            return sum(m or 0 for m in seen) if seen else None
        return used

    def reset(self) -> None:
        self.peak, self.own_peak = 0, None

    def gib(self) -> float | None:
        return self.peak / GIB if CUDA else None

    def own_gib(self) -> float | None:
        return None if self.own_peak is None else self.own_peak / GIB


@functools.cache
def device_peak() -> DevicePeak:
    """The one sampler of a process, started at its first variant."""
    return DevicePeak()


def run_variant(name: str, run, args, report=None) -> dict:
    """Run one variant here; an OOM or an error ends it with a status saying so, its traceback and the step it
    reached."""
    free_memory()
    device_peak().reset()
    result = {"variant": name, "status": "ok", "start_alloc_gib": torch.cuda.memory_allocated() / GIB if CUDA else None}
    timer = StepTimer(args.budget_s, 1 if args.fake_oom == name else None,
                      report and (lambda steps: report({**result, "steps": steps})),
                      getattr(args, "profile_step", None), out_dir() / f"profile_{name}{args.tag}")
    start = time.perf_counter()
    try:
        run(args, timer, result)
    except torch.OutOfMemoryError as error:
        result["status"] = f"OOM after step {len(timer.steps)}"
        print(f"{name}: {result['status']}: {error}", flush=True)
    except Exception as error:  # reported in the table; the next variant still runs
        result["status"] = f"error: {type(error).__name__}: {str(error)[:300]}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
    result["wall_s"], result["device_peak_gib"] = time.perf_counter() - start, device_peak().gib()
    result["process_peak_gib"] = device_peak().own_gib()  # this process's, where NVML sees it
    if utilization := result.get("model_kwargs", {}).get("gpu_memory_utilization"):  # vLLM's share, weights + KV
        result["vllm_gib"] = utilization * torch.cuda.mem_get_info()[1] / GIB
    if timer.steps:
        result.update(timer.setup, steps=timer.steps, generate_calls=timer.gen.calls)
        if not timer.gen.calls:  # generation ran where the wrapper doesn't see it: leave the split unmeasured
            result["steps"] = [{**step, "gen_s": None, "update_s": None, "gen_rest_s": None, "rest_s": None}
                               for step in timer.steps]
    result.update(summary(result.setdefault("steps", []), result.get("env_tools_s"),
                          result.get("env_tools_concurrent_s")))
    free_memory()
    return result


def steady_steps(steps: list[dict]) -> list[dict]:
    """The steps after the first, whose time is mostly compiling, but a profiled one."""
    return [step for step in steps[1:] if not step.get("profiled")]


def median_steps(steps: list[dict]) -> list[dict]:
    """The steady step by its time: the middle one of the steady steps, or the middle two of an even count. Whole steps,
    so their parts still add up; a second step still compiling a new shape's kernels (a cold cache) falls out of it."""
    steady = sorted(steady_steps(steps), key=lambda step: step["step_s"])
    return steady[(len(steady) - 1) // 2:len(steady) // 2 + 1]


def write_profile(profiler, path: Path, rows: int = 60) -> None:
    """A profiled step's operators and kernels by their own time on the GPU (on a CPU, the CPU's), most first: a
    table in ``path``.txt, and the first ``rows`` as JSON in ``path``.json (times in seconds)."""
    averages = profiler.key_averages()
    own = "self_device_time_total" if CUDA else "self_cpu_time_total"
    path.with_suffix(".txt").write_text(averages.table(sort_by=own, row_limit=rows, max_name_column_width=90))
    ranked = sorted(averages, key=lambda average: getattr(average, own), reverse=True)[:rows]
    path.with_suffix(".json").write_text(json.dumps([
        {"name": average.key, "calls": average.count, "self_s": getattr(average, own) / 1e6,
         "total_s": (average.device_time_total if CUDA else average.cpu_time_total) / 1e6,
         "cpu_self_s": average.self_cpu_time_total / 1e6} for average in ranked], indent=1))


def summary(steps: list[dict], env_tools_s: float | None = None, concurrent_s: float | None = None) -> dict:
    """The steady step (``steady_*``: the median step after the first, ``median_steps``; None after one step, whose
    time is mostly compiling), and peaks over every step."""
    steady = median_steps(steps)

    def mean(key):
        values = [step[key] for step in steady if step.get(key) is not None]
        return sum(values) / len(values) if values else None

    out = {"reached_step": len(steps), **{f"steady_{key}": mean(key) for key in ("step_s", "gen_s", "env_s",
                                                                                  "update_s", "engine_s",
                                                                                  "engine_steps", "engine_ms",
                                                                                  *PARTS, *LOGGED)},
           **{k: max((s[k] for s in steps if s.get(k) is not None), default=None)
              for k in ("gen_peak_alloc_gib", "peak_alloc_gib", "peak_reserved_gib")}}
    if out["steady_step_s"]:
        out["env_pct"] = 100 * out["steady_env_s"] / out["steady_step_s"]
        out["env_tools_pct"] = None if env_tools_s is None else 100 * env_tools_s / out["steady_step_s"]
        out["env_tools_concurrent_pct"] = None if concurrent_s is None else 100 * concurrent_s / out["steady_step_s"]
    return out


def markdown(columns: list[tuple], results: list[dict]) -> list[str]:
    """A markdown table in ``columns`` (header, key, decimals of a float): each variant's steps, then its steady row."""
    return markdown_rows(columns, [row for r in results for row in [
        *({"variant": r["variant"], **s} for s in r["steps"]),
        {**{k.removeprefix("steady_"): v for k, v in r.items()},
         "step": f"steady of {r['reached_step']}" if r["reached_step"] > 1 else "no steady step"}]])


def markdown_rows(columns: list[tuple], rows: list[dict]) -> list[str]:
    """A markdown table of ``rows`` in ``columns`` (header, key, decimals of a float)."""
    cell = lambda v, d: "-" if v is None else f"{v:.{d}f}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(cell(row.get(k), d) for _, k, d in columns) + " |" for row in rows)]



def settings(pairs: list[str]) -> dict:
    """``--set`` pairs as GRPO settings: ``per_device_train_batch_size=4`` -> {"per_device_train_batch_size": 4}."""
    def value(text):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return {key: value(text) for key, _, text in (pair.partition("=") for pair in pairs)}


def out_dir() -> Path:
    """Where reports go: $OUT, ./bench-out if unset."""
    (out := Path(os.environ.get("OUT") or "bench-out")).mkdir(parents=True, exist_ok=True)
    return out


def write_report(name: str, report: dict) -> Path:
    """``report`` as JSON in ``out_dir()``."""
    (path := out_dir() / name).write_text(json.dumps(report, indent=1))
    return path
