"""GRPO on one GPU held to an L4's 24 GB: the kit's own path (notebook 03), in each precision of vLLM's weights and with
the async trainer, against bare Unsloth and plain TRL.

Usage::

    python bench/gpu_grpo.py --model /tmp/q4b                  # "24gb", capped at 24 GB, 3 steps a variant
    python bench/gpu_grpo.py --model /tmp/q4b --variants bare,kit,kit-4bit,kit-fp8,kit-async --budget-s 150
    python bench/gpu_grpo.py --model /tmp/q4b --preset 16bit --no-cap --variants kit,bare
    python bench/gpu_grpo.py --model /tmp/q4b --variants kit,bare --no-vllm --tag _novllm   # transformers' generate
    python bench/gpu_grpo.py --smoke                           # CPU plumbing: tiny model, "cpu-tiny", 1 step
    python bench/gpu_grpo.py --model /tmp/q4b --variants bare --set steps_per_generation=1 --memory-history 4000000

Each variant runs in a process of its own (its own model and vLLM engine, its own peak memory); one that fails or passes
``--budget-s`` (plus ``--setup-s`` to load) is recorded with its exact error and the others still run. Variants, with
the preset's GRPO settings (32 rollouts a step, 1024 completion tokens), eval off, on one GridSim bundle: ``kit``,
notebook 03's path (``AgentEnv.local``, process sandbox, 64 sessions over ``--server-processes`` server processes;
``loading.load_model``; ``presets.grpo_config``; Unsloth's GRPOTrainer with ``env.factory``, ``env.reward_funcs``,
``env.metrics``, the console live plot) with vLLM's weights the preset's choice for the card; ``kit-4bit``, ``kit-fp8``
and ``kit-16bit``, the same in 4-bit (the recipe's), fp8 and 16-bit (``Preset.vllm_weights``); ``kit-async``, the
preset's own weights through ``train.grpo.trainer.async_grpo_trainer``, Unsloth's AsyncGRPOTrainer, whose generation overlaps
the update; ``bare``, Unsloth's GRPOTrainer with the in-process ``ToyGridSim`` and the recipe's 4-bit, the floor the kit
adds to; ``trl``, stock TRL with bitsandbytes 4-bit (bf16 for "16bit") and a PEFT LoRA on ToyGridSim, what a user would
pick instead. A step splits into generation (``generate`` calls, and of their time vLLM's engine steps, their count and
mean, the rest being Unsloth's fold or LoRA load and the requests' bookkeeping; for ``kit-async`` vLLM's engine steps,
which overlap the update), env (inside reset, tools, get_reward; overlaps counted once) and update (the rest; for
``kit-async`` the trainer's training steps), with peak GPU memory. A random model calls no tools, so the kit also times
a step's episodes played with the expert's 3 tool calls each (bench/expert_step.py), in TRL's order and at once
(``env_tools_s``, ``env_tools_concurrent_s``). An OOM is reported with the step reached; a variant stops after the step
past ``--budget-s``. ``--set KEY=VALUE`` changes a GRPO setting for every variant (the 32-at-once rows of
docs/benchmarks.md: ``steps_per_generation=1``); ``--memory-history N`` dumps the CUDA allocator's history of each
variant for ``bench/memory_peak.py``.
Prints markdown; writes ``$OUT/grpo_<preset>[_nocap][TAG].json``, and each variant's log, ``$OUT/grpo_<variant>.log``.
"""

import argparse
import functools
import gc
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

from agentenv_nb.stack import import_unsloth

GIB, CUDA = 2**30, torch.cuda.is_available()
VARIANT = sys.argv[sys.argv.index("--variant") + 1] if "--variant" in sys.argv else None  # a variant's own process
# Unsloth before transformers and TRL load, so it patches them; the TRL variant stays stock TRL on a GPU (on a CPU,
# TRL 1.15 can't step without unsloth_zoo's patch). Not in the parent, which only runs the variants and touches no GPU,
# nor where multiprocessing's spawn runs this script again as __mp_main__ (the async trainer's rollout process)
if VARIANT and (VARIANT != "trl" or not CUDA) and __name__ == "__main__":
    import_unsloth()
from transformers import TrainerCallback  # noqa: E402

import expert_step  # noqa: E402  (bench/, beside this script)
from agentenv_nb.tasks.gridsim import battery, write_bundle  # noqa: E402

# vLLM's weights a variant loads (Preset.vllm_weights); None: the preset's own, "24gb"'s being the card's choice (the
# trl variant loads its own way)
WEIGHTS = {"kit": None, "kit-4bit": "4bit", "kit-fp8": "fp8", "kit-16bit": "16bit", "kit-async": None, "bare": "4bit",
           "trl": None}
VARIANTS = tuple(WEIGHTS)
# What the trainer logs that a step's row keeps; the async trainer's own: the rollouts a step trained on (its token
# budget packs them, so not always per_device_train_batch_size x gradient_accumulation_steps), those waiting in its
# queue, and how long the step waited for one (0: the update, not generation, was what the step waited on)
LOGGED = ("tools/call_frequency", "completions/mean_length", "reward", "loss", "batch/samples_per_step",
          "sample/rollout_queue_size", "perf/rollout_wait_s")


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
    """Wall time spent inside timed calls, overlapping calls counted once, the number of calls, and (``sync``) the
    peak GPU memory allocated when the last call returned."""

    def __init__(self):
        self.total, self.calls, self._active, self._since, self._lock = 0.0, 0, 0, 0.0, threading.Lock()
        self.peak_gib = None

    def wrap(self, function, sync: bool = False):
        """``function`` timed on this clock, its name, docstring and signature kept (TRL reads tools by them)."""
        @functools.wraps(function)
        def timed(*args, **kwargs):
            with self._lock:
                if not self._active:
                    self._since = time.perf_counter()
                self._active, self.calls = self._active + 1, self.calls + 1
            try:
                return function(*args, **kwargs)
            finally:
                if sync and CUDA:
                    torch.cuda.synchronize()
                    self.peak_gib = torch.cuda.max_memory_allocated() / GIB
                with self._lock:
                    self._active -= 1
                    if not self._active:
                        self.total += time.perf_counter() - self._since
        return timed


def timed_class(cls: type, clock: Clock) -> type:
    """A subclass of ``cls`` whose reset, tools and get_reward run on ``clock``; its name, TRL's reward column's."""
    methods = {name: clock.wrap(function) for name, function in inspect.getmembers(cls, inspect.isfunction)
               if not name.startswith("_")}
    return type(cls.__name__, (cls,), {**methods, "__qualname__": cls.__qualname__, "__module__": cls.__module__})


class StepTimer(TrainerCallback):
    """Per optimizer step: wall time split into generation, env and update, peak GPU memory, logged metrics; and
    ``setup``, the time and peak memory before step 1. Stops after the step past ``budget_s``; ``report`` gets steps."""

    def __init__(self, budget_s: float | None = None, fake_oom_step: int | None = None, report=None):
        self.gen, self.env, self.steps, self.setup, self._start = Clock(), Clock(), [], {}, time.perf_counter()
        self.update = Clock()  # timed only where generation overlaps the update (kit-async): its training steps
        # vLLM's engine steps inside generation (the synchronous variants): what generation spends in vLLM's forward
        # passes and sampling, against the rest of it (Unsloth's fold of the LoRA and its restore, or its LoRA load
        # for 4-bit weights; adding requests; TRL's parsing)
        self.engine = Clock()
        self.budget_s, self.fake_oom_step, self.report = budget_s, fake_oom_step, report

    def on_train_begin(self, args, state, control, **kwargs):
        self.setup = {"setup_s": time.perf_counter() - self._start, **{f"setup_{k}": v for k, v in peaks().items()}}
        self._start = time.perf_counter()
        self._begin = self._clocks()

    def _clocks(self) -> tuple:
        return (time.perf_counter(), self.gen.total, self.env.total, self.update.total, self.engine.total,
                self.engine.calls)

    def on_step_begin(self, args, state, control, **kwargs):
        free_memory(collect=False)
        self.gen.peak_gib = None

    def on_step_end(self, args, state, control, **kwargs):
        # A step runs from the last one's end: the trainer fetches its batch before on_step_begin, and the async
        # trainer's batch is its rollouts, which it may wait for (TRL's perf/rollout_wait_s)
        if CUDA:
            torch.cuda.synchronize()
        now = self._clocks()
        step_s, gen, env, update, engine, engine_steps = (a - b for a, b in zip(now, self._begin))
        self._begin = now
        self.steps.append({"step": state.global_step, "step_s": step_s, "gen_s": gen, "env_s": env,
                           "update_s": update if self.update.calls else step_s - gen - env,
                           **({"engine_s": engine, "engine_steps": engine_steps,
                               "engine_ms": 1e3 * engine / max(engine_steps, 1)} if engine_steps else {}),
                           "env_pct": 100 * env / step_s,
                           "gen_peak_alloc_gib": self.gen.peak_gib, **peaks()})
        if self.fake_oom_step == state.global_step:
            raise torch.OutOfMemoryError(f"simulated by --fake-oom after step {state.global_step}")
        control.should_training_stop |= bool(self.budget_s and time.perf_counter() - self._start > self.budget_s)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.steps and logs and self.steps[-1]["step"] == state.global_step:
            self.steps[-1].update({key: logs[key] for key in LOGGED if key in logs})
            if self.report:
                self.report(self.steps)


class ToyGridSim:
    """A GridSim day played in this process with the env's battery rules and tools: no server, no session."""

    def reset(self, **row):
        self.prices, self.schedule = row["prices"], None

    def get_prices(self) -> str:
        """The day's 24 hourly prices in $/MWh, hour 0 (midnight) first, as a JSON list."""
        return json.dumps(self.prices)

    def submit_schedule(self, schedule: list[int]) -> str:
        """Submit the battery's schedule for the day; a later submission replaces an earlier one.

        Args:
            schedule: 24 integers, one an hour from hour 0: 1 charges 1 MWh, -1 sells 1 MWh, 0 idles.
        """
        profit, self.schedule = battery.settle(self.prices, schedule)[0], list(schedule)
        return f"schedule accepted: profit ${profit:.2f}"

    def end_turn(self, response: str = "") -> str:
        """End your turn and hand your answer to the task.

        Args:
            response: Your final answer.
        """
        return "The episode has ended."

    def get_reward(self) -> float:
        return 0.0 if self.schedule is None else battery.score(self.prices, self.schedule)


def toy_rows(bundle: str):
    """The bundle's train days as a dataset: the kit's prompt (its task's system prompt and prompt), the prices."""
    from datasets import Dataset
    from agentenv_nb.tasks.gridsim.generate import SYSTEM_PROMPT, read_days
    return Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": f"Schedule the battery for {day['day']}."}],
                               "prices": day["prices"]} for day in read_days(bundle, "train")])


def train(trainer, timer: StepTimer, result: dict) -> None:
    result["rollouts_per_step"] = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
    trainer.model.generate = timer.gen.wrap(trainer.model.generate, sync=True)  # an instance attribute: no patching
    if engine := getattr(trainer.model, "vllm_engine", None):  # Unsloth's colocated vLLM: TRL calls its generate
        # the instance's generate: Unsloth wraps it for 16-bit merged-weight rollouts, and vLLM refuses the sentinel
        # LoRA request that wrapper takes when the class's generate is called instead
        engine.generate = timer.gen.wrap(engine.generate, sync=True)
        engine.llm_engine.step = timer.engine.wrap(type(engine.llm_engine).step.__get__(engine.llm_engine))
    trainer.train()


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


def variant_preset(args):
    """The preset this process's variant trains with: ``--preset`` with vLLM's weights as the variant says, or
    without vLLM (``--no-vllm``)."""
    import dataclasses

    from agentenv_nb.train import presets
    preset = presets.named(args.preset)
    return dataclasses.replace(preset, vllm_weights=WEIGHTS[args.variant] or preset.vllm_weights,
                               vllm=preset.vllm and args.vllm)


def load(model: str, preset, overrides: str):
    """The preset's model with LoRA, as ``loading.load_model`` gives it (``overrides``: JSON of from_pretrained
    arguments over the preset's), and those arguments."""
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading
    kwargs = {**presets.model_kwargs(preset, model), **json.loads(overrides)}
    shown = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in kwargs.items()}
    if not json.loads(overrides):
        return (*loading.load_model(model, preset), shown)
    from unsloth import FastLanguageModel
    loaded, tokenizer = FastLanguageModel.from_pretrained(**kwargs)
    return FastLanguageModel.get_peft_model(loaded, **presets.peft_kwargs(preset)), tokenizer, shown


def run_kit(args, timer: StepTimer, result: dict) -> None:
    from agentenv_nb import AgentEnv
    from agentenv_nb.train.grpo.trainer import GRPOTrainer
    from agentenv_nb.train import presets
    from agentenv_nb.train.live import live_plot
    with AgentEnv.local(args.bundle, split="train", sandbox="process", max_concurrent_envs=64,
                        processes=args.server_processes) as env:
        model, tokenizer, result["model_kwargs"] = load(args.model, variant_preset(args), json.dumps(args.load))
        env.check(tokenizer)
        config = presets.grpo_config(variant_preset(args), **args.overrides)
        train(GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                          environment_factory=timed_class(env.factory, timer.env), reward_funcs=env.reward_funcs,
                          callbacks=[env.metrics, live_plot("console"), timer]), timer, result)
        for concurrent in (False, True):  # TRL's loop, then agentenv_nb.train.grpo.trainer's concurrent tool calls
            result.update(expert_step.expert_step(env.factory, env.dataset.to_list(), result["rollouts_per_step"],
                                                  config.generation_batch_size, concurrent))


def run_kit_async(args, timer: StepTimer, result: dict) -> None:
    """Unsloth's AsyncGRPOTrainer through ``train.grpo.trainer.async_grpo_trainer``, the preset's settings it takes: its
    rollout process plays ``env.factory`` pickled, on the same servers as ``kit``."""
    import dataclasses

    from trl.experimental.async_grpo import AsyncGRPOConfig

    from agentenv_nb import AgentEnv
    from agentenv_nb.train import presets
    from agentenv_nb.train.grpo.trainer import async_grpo_trainer
    taken = {field.name for field in dataclasses.fields(AsyncGRPOConfig)}
    result["settings_not_taken"] = sorted(set(args.overrides) - taken)  # e.g. steps_per_generation
    with AgentEnv.local(args.bundle, split="train", sandbox="process", max_concurrent_envs=64,
                        processes=args.server_processes) as env:
        model, tokenizer, result["model_kwargs"] = load(args.model, variant_preset(args), json.dumps(args.load))
        env.check(tokenizer)
        config = presets.async_grpo_config(variant_preset(args), **{k: v for k, v in args.overrides.items()
                                                                    if k in taken})
        result["max_inflight_tasks"] = config.max_inflight_tasks  # its rollouts a step: as its steps log them
        if engine := getattr(model, "vllm_engine", None):  # the engine thread's steps, overlapping the update
            engine.llm_engine.step = timer.gen.wrap(type(engine.llm_engine).step.__get__(engine.llm_engine))
        trainer = async_grpo_trainer(model, tokenizer, config, env, callbacks=[timer])
        trainer.training_step = timer.update.wrap(trainer.training_step, sync=True)  # an instance attribute
        trainer.train()


def run_bare(args, timer: StepTimer, result: dict) -> None:
    from trl import GRPOTrainer

    from agentenv_nb.train import presets
    model, tokenizer, result["model_kwargs"] = load(args.model, variant_preset(args), json.dumps(args.load))
    config = presets.grpo_config(variant_preset(args), **args.overrides)
    train(GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                      train_dataset=toy_rows(args.bundle), environment_factory=timed_class(ToyGridSim, timer.env),
                      callbacks=[timer]), timer, result)


def trl_grpo_kwargs(args) -> dict:
    """The preset's GRPO settings as the kit makes them on this machine (``presets.grpo_kwargs``, which imports
    Unsloth), made in a process of their own so this one stays stock TRL."""
    made = subprocess.run([sys.executable, "-c", "import json, sys; from agentenv_nb.train import presets; "
                           "print(json.dumps(presets.grpo_kwargs(sys.argv[1], **json.loads(sys.argv[2]))))",
                           args.preset, json.dumps(args.overrides)], capture_output=True, text=True)
    if made.returncode:
        raise RuntimeError(f"presets.grpo_kwargs failed: {made.stderr[-2000:]}")
    return json.loads(made.stdout.strip().splitlines()[-1])


def run_trl_here(args, timer: StepTimer, result: dict) -> None:
    """The ``trl`` variant inside its subprocess: stock TRL, transformers' 4-bit loading, a PEFT LoRA."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import GRPOConfig, GRPOTrainer

    from agentenv_nb.train import presets
    dtype = torch.float32 if args.preset == "cpu-tiny" else torch.bfloat16
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16) if args.preset == "24gb" else None
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, quantization_config=quantization,
                                                 device_map={"": 0} if CUDA else None)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    lora = {k: v for k, v in presets.peft_kwargs(args.preset).items() if k in ("r", "lora_alpha", "target_modules")}
    config = GRPOConfig(**{**trl_grpo_kwargs(args), "scale_rewards": "group"})
    train(GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=toy_rows(args.bundle),
                      environment_factory=timed_class(ToyGridSim, timer.env), callbacks=[timer],
                      peft_config=LoraConfig(**lora, lora_dropout=0.0, task_type="CAUSAL_LM")), timer, result)


RUNS = {"kit": run_kit, "kit-4bit": run_kit, "kit-fp8": run_kit, "kit-16bit": run_kit, "kit-async": run_kit_async,
        "bare": run_bare, "trl": run_trl_here}


def in_own_process(name: str, args) -> dict:
    """Variant ``name`` run in a process of its own (this script with ``--variant``), which writes its result after
    each step and at its end; its output goes to ``$OUT/grpo_<name>.log``. A process that fails, is killed or runs
    past ``--budget-s`` plus ``--setup-s`` leaves the steps it reached, the last lines it wrote and why it ended."""
    found, log = Path(args.work) / f"{name}.result", out_dir() / f"grpo_{name}{args.tag}.log"
    command = [sys.executable, os.path.abspath(__file__), *args.argv, "--variant", name, "--model", args.model,
               "--bundle", args.bundle, "--work", args.work]  # the same options, and what this process made
    limit = args.budget_s + args.setup_s
    start = time.perf_counter()
    with log.open("w") as written:
        child = subprocess.Popen(command, stdout=written, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = f"timeout: killed after {limit:.0f} s (--budget-s {args.budget_s:g} + --setup-s {args.setup_s:g})"
        finally:  # past the limit, or this process told to stop: its env servers and vLLM's workers go too
            if child.poll() is None:
                os.killpg(child.pid, 9)
                child.wait()
    result = {"variant": name, "status": "ok", "steps": []}
    lines = log.read_text(errors="replace").splitlines()
    ended = code if isinstance(code, str) else f"error: exit code {code}"
    try:
        result.update(json.loads(found.read_text()))
    except (OSError, json.JSONDecodeError):
        last = next((line for line in reversed(lines) if line.strip()), "(nothing)")
        result["status"] = f"{ended}; no result; its log ends: {last[-300:]}"
    if code and result["status"] == "ok":
        result["status"] = ended
    if result["status"] != "ok":
        result["log_tail"] = lines[-40:]
    result.setdefault("wall_s", time.perf_counter() - start)
    print("\n".join(lines[-15:]), flush=True)
    result = {**summary(result["steps"]), **result, "weights": loaded_weights(result)}
    result["rollouts_per_s"] = rollouts_per_s(result)
    return result


def rollouts_per_s(result: dict) -> float | None:
    """The rollouts trained on a second over the steady steps: as each step logged them where the trainer does (the
    async trainer's), else the configured rollouts a step."""
    steady = result["steps"][1:] or result["steps"]
    seconds = sum(step["step_s"] for step in steady)
    if steady and all(step.get("batch/samples_per_step") for step in steady):
        return sum(step["batch/samples_per_step"] for step in steady) / seconds
    return result.get("rollouts_per_step") and seconds and result["rollouts_per_step"] * len(steady) / seconds


def run_variant(name: str, run, args, report=None) -> dict:
    """Run one variant here; an OOM or an error ends it with a status saying so, its traceback and the step it
    reached."""
    free_memory()
    device_peak().reset()
    result = {"variant": name, "status": "ok", "start_alloc_gib": torch.cuda.memory_allocated() / GIB if CUDA else None}
    timer = StepTimer(args.budget_s, 1 if args.fake_oom == name else None,
                      report and (lambda steps: report({**result, "steps": steps})))
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
            result["steps"] = [{**step, "gen_s": None, "update_s": None} for step in timer.steps]
    result.update(summary(result.setdefault("steps", []), result.get("env_tools_s"),
                          result.get("env_tools_concurrent_s")))
    free_memory()
    return result


def summary(steps: list[dict], env_tools_s: float | None = None, concurrent_s: float | None = None) -> dict:
    """The steady step (the mean of the steps after the first, ``steady_*``), and peaks over every step."""
    steady = steps[1:] or steps

    def mean(key):
        values = [step[key] for step in steady if step.get(key) is not None]
        return sum(values) / len(values) if values else None

    out = {"reached_step": len(steps), **{f"steady_{key}": mean(key) for key in ("step_s", "gen_s", "env_s",
                                                                                  "update_s", "engine_s",
                                                                                  "engine_steps", "engine_ms",
                                                                                  *LOGGED)},
           **{k: max((s[k] for s in steps if s.get(k) is not None), default=None)
              for k in ("gen_peak_alloc_gib", "peak_alloc_gib", "peak_reserved_gib")}}
    if out["steady_step_s"]:
        out["env_pct"] = 100 * out["steady_env_s"] / out["steady_step_s"]
        out["env_tools_pct"] = None if env_tools_s is None else 100 * env_tools_s / out["steady_step_s"]
        out["env_tools_concurrent_pct"] = None if concurrent_s is None else 100 * concurrent_s / out["steady_step_s"]
    return out


def loaded_weights(result: dict) -> str | None:
    """The precision of the weights a variant loaded, from its from_pretrained arguments."""
    kwargs = result.get("model_kwargs") or {}
    if not kwargs:
        return None
    return "fp8" if kwargs.get("load_in_fp8") else "4bit" if kwargs.get("load_in_4bit") else "16bit"


COLUMNS = [("variant", "variant", 0), ("weights", "weights", 0), ("step", "step", 0), ("status", "status", 0),
           ("step s", "step_s", 1),
           ("gen s", "gen_s", 1), ("of it vLLM's engine steps s", "engine_s", 2), ("engine steps", "engine_steps", 0),
           ("ms an engine step", "engine_ms", 2), ("env s", "env_s", 2), ("update s", "update_s", 1),
           ("env %", "env_pct", 1),
           ("peak alloc by generation's end GiB", "gen_peak_alloc_gib", 2), ("peak alloc GiB", "peak_alloc_gib", 2),
           ("peak reserved GiB", "peak_reserved_gib", 2), ("device peak GiB", "device_peak_gib", 2),
           ("process peak GiB", "process_peak_gib", 2),
           ("tool calls", "tools/call_frequency", 2), ("completion len", "completions/mean_length", 0),
           ("rollouts", "batch/samples_per_step", 0), ("queued", "sample/rollout_queue_size", 1),
           ("waited s", "perf/rollout_wait_s", 2), ("rollouts/s", "rollouts_per_s", 2)]


def markdown(columns: list[tuple], results: list[dict]) -> list[str]:
    """A markdown table in ``columns`` (header, key, decimals of a float): each variant's steps, then its steady row."""
    rows = [row for r in results for row in [*({"variant": r["variant"], **s} for s in r["steps"]), {
        **{k.removeprefix("steady_"): v for k, v in r.items()}, "step": f"steady of {r['reached_step']}"}]]
    cell = lambda v, d: "-" if v is None else f"{v:.{d}f}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(cell(row.get(k), d) for _, k, d in columns) + " |" for row in rows)]


def whole_process_gib(result: dict) -> float | None:
    """A variant's whole-process peak: NVML's count of its process where there is one, else the device's (which
    counts whatever else ran on the GPU then)."""
    return result.get("process_peak_gib") or result.get("device_peak_gib")


def speed_goals(results: list[dict]) -> list[tuple]:
    """The goals of the precisions and the async trainer: the kit's step, in the weights the preset chose, against
    bare Unsloth's 4-bit (2x faster), the async trainer's seconds a rollout against the synchronous kit's of the same
    weights (1.5x the rollouts a second), and each kit variant's whole process within the 24 GB."""
    by = {r["variant"]: r for r in results if r.get("steady_step_s")}
    goals = []
    sync = [r for name, r in by.items() if name in ("kit", "kit-4bit", "kit-fp8", "kit-16bit")]
    if "kit" in by and "bare" in by:
        goals.append((f"kit step, the preset's choice ({by['kit']['weights']}) / bare Unsloth 4-bit step (x)",
                      by["kit"]["steady_step_s"] / by["bare"]["steady_step_s"], 0.5))
    if (run := by.get("kit-async")) and run.get("rollouts_per_s"):
        same = next((r for r in sync if r.get("weights") == run.get("weights") and r.get("rollouts_per_s")), None)
        if same:
            goals.append((f"kit-async seconds a rollout / {same['variant']}'s, the same {run['weights']} weights (x)",
                          same["rollouts_per_s"] / run["rollouts_per_s"], 1 / 1.5))
    goals += [(f"{name} peak GPU memory, the whole process (GB)", whole_process_gib(r) * GIB / 1e9, 24)
              for name, r in by.items() if name.startswith("kit-") and whole_process_gib(r)]
    return goals


def table(results: list[dict]) -> str:
    """The variants' steps and steady rows, and the goals checked on the kit's and bare Unsloth's."""
    bare = next((r for r in results if r["variant"] == "bare"), {})  # the kit's overhead: at bare's 4-bit weights
    kit = next((r for r in results if r["variant"] in ("kit", "kit-4bit") and r.get("weights") == bare.get("weights")),
               next((r for r in results if r["variant"] == "kit"), {}))
    ratio = kit.get("steady_step_s") and bare.get("steady_step_s") and kit["steady_step_s"] / bare["steady_step_s"]
    vllm = "vllm_gib" in kit
    goals = [("kit step / bare Unsloth step (x)", ratio, 1.05 if vllm else 1.1),
             ("kit env time (% of a step)", kit.get("env_pct"), 5),
             ("kit env time with the expert's 3 tool calls a rollout (% of a step)", kit.get("env_tools_pct"), 5),
             ("the same, the tool calls run concurrently (agentenv_nb.train.grpo.trainer) (% of a step)",
              kit.get("env_tools_concurrent_pct"), 5),
             ("kit peak reserved (GiB)", kit.get("peak_reserved_gib"), 16)]
    if vllm and whole_process_gib(kit):  # the whole process, vLLM's share included, within the card it stands for
        goals.append(("kit peak GPU memory, the whole process with vLLM's "
                      f"{kit['vllm_gib']:.1f} GiB (GB)", whole_process_gib(kit) * GIB / 1e9, 24))
    goals += speed_goals(results)
    return "\n".join(markdown(COLUMNS, results) + [""] + [
        f"- {text}: {value:.2f} (goal <= {limit:g}): {'PASS' if value <= limit else 'FAIL'}"
        for text, value, limit in goals if value])


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="the model folder (the random Qwen3-4B-shaped one: train.model.tiny.build_random_qwen3_4b)")
    parser.add_argument("--preset", default="24gb", choices=("24gb", "16bit", "cpu-tiny"),
                        help="the preset every variant trains with; the variant names vLLM's weights")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=200.0, help="a variant stops after the step that passes it")
    parser.add_argument("--setup-s", type=float, default=400.0,
                        help="a variant's process is killed past --budget-s plus this (imports, vLLM's load)")
    parser.add_argument("--cap-gb", type=float, default=24.0, help="GPU memory held to this many GB (1e9 bytes)")
    parser.add_argument("--no-cap", dest="cap_gb", action="store_const", const=None, help="the whole GPU")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a GRPO setting over the preset's for every variant, VALUE as JSON (else a string)")
    parser.add_argument("--server-processes", type=int, default=8,
                        help="the kit's env servers beside the trainer (AgentEnv.local's processes; 0: a thread)")
    parser.add_argument("--memory-history", type=int, default=0, metavar="N",
                        help="record the CUDA allocator's last N events a variant and dump them to $OUT (0: off)")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false",
                        help="generate with transformers' generate, as a preset does where vLLM doesn't import")
    parser.add_argument("--load", action="append", default=[], metavar="KEY=VALUE",
                        help="a from_pretrained argument over the preset's, VALUE as JSON (e.g. max_num_seqs=64)")
    parser.add_argument("--tag", default="", help="appended to the JSON report's name")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing: tiny model, cpu-tiny, 1 step")
    parser.add_argument("--fake-oom", choices=VARIANTS, help="raise an OOM after that variant's first step")
    for hidden in ("--bundle", "--work", "--variant"):  # set for a variant's own process
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.variants = args.variants.split(",")
    if not set(args.variants) <= set(VARIANTS):
        parser.error(f"--variants takes some of {', '.join(VARIANTS)}")
    if args.smoke:
        args.preset, args.steps, args.cap_gb = "cpu-tiny", 1, None
    elif not args.model:
        parser.error("--model is required (or --smoke)")
    return args


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


def run_here(args) -> None:
    """In a variant's own process: run it, held to the cap, writing its result after each step and at its end."""
    cap_memory(args.cap_gb)
    report = Path(args.work, f"{args.variant}.result").write_text
    if args.memory_history and CUDA:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=args.memory_history)
    result = run_variant(args.variant, RUNS[args.variant], args, lambda partial: report(json.dumps(partial)))
    result["device"] = torch.cuda.get_device_name(0) if CUDA else "cpu"
    report(json.dumps(result))
    if args.memory_history and CUDA:  # bench/memory_peak.py reads it, as does pytorch.org/memory_viz
        torch.cuda.memory._dump_snapshot(str(out_dir() / f"memory_{args.variant}{args.tag}.pickle"))


def main(argv=None) -> dict | None:
    args = parse(argv)
    args.load = settings(args.load)
    if not args.variant:
        args.work = tempfile.mkdtemp(prefix="gpu_grpo.")
        if args.smoke:
            from agentenv_nb.train.model.tiny import build_tiny_model
            args.model = build_tiny_model(Path(args.work) / "tiny")
        args.bundle = str(write_bundle(Path(args.work) / "gridsim", train=64, eval=4))
    args.overrides = {"output_dir": str(Path(args.work) / f"grpo-{args.variant}"), "max_steps": args.steps,
                      "eval_strategy": "no", "eval_on_start": False, **settings(args.set)}  # every variant's changes
    if args.variant:
        return run_here(args)
    import importlib.metadata
    import importlib.util
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM: the running variant is killed too
    versions = {m: importlib.metadata.version(m) for m in ("torch", "transformers", "trl", "unsloth", "vllm", "torchao")
                if importlib.util.find_spec(m)}
    report = {"preset": args.preset, "cap_gb": args.cap_gb, "steps": args.steps, "smoke": args.smoke, "device": "cpu",
              "settings": settings(args.set), "load": args.load, "budget_s": args.budget_s,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "versions": versions, "results": []}
    name = f"grpo_{args.preset}{'' if args.cap_gb else '_nocap'}{args.tag}.json"
    for variant in args.variants:
        weights = WEIGHTS[variant] or "the preset's"
        print(f"== {variant} ({args.preset}, vLLM's weights {weights}, cap {args.cap_gb or 'none'} GB, "
              f"{args.steps} steps)", flush=True)
        report["results"].append(result := in_own_process(variant, args))
        report["device"] = result.get("device") or report["device"]
        path = write_report(name, report)  # after each variant: a run cut short keeps what it measured
        print(table([result]), flush=True)
    print(f"\n## GRPO, {args.preset}, GPU held to {args.cap_gb or 'all'} GB, {report['device']}\n\n"
          f"{table(report['results'])}")
    print(f"\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
