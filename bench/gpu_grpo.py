"""GRPO on one GPU held to an L4's 24 GB: the kit's own path (notebook 03), in each precision of vLLM's weights and with
the async trainer, against bare Unsloth and plain TRL.

Usage::

    python bench/gpu_grpo.py --model /tmp/q4b                  # "24gb", capped at 24 GB, 4 steps a variant
    python bench/gpu_grpo.py --model /tmp/q4b --variants bare,kit,kit-4bit,kit-fp8,kit-async --budget-s 150
    python bench/gpu_grpo.py --model /tmp/q4b --preset 16bit --no-cap --variants kit,bare
    python bench/gpu_grpo.py --model /tmp/q4b --variants kit,bare --no-vllm --tag _novllm   # transformers' generate
    python bench/gpu_grpo.py --smoke                           # CPU plumbing: tiny model, "cpu-tiny", 2 steps
    python bench/gpu_grpo.py --model /tmp/q4b --variants bare --set steps_per_generation=1 --memory-history 4000000
    python bench/gpu_grpo.py --model /tmp/q4b --variants kit --preset-set gradient_checkpointing=true --tag _gc
    python bench/gpu_grpo.py --model /tmp/q4b --variants kit --environ UNSLOTH_VLLM_STANDBY=1 --no-cap --tag _standby
    python bench/gpu_grpo.py --model /tmp/q4b --variants kit --steps 5 --budget-s 90 --profile-step 3 --tag _prof

Each variant runs in a process of its own (its own model and vLLM engine, its own peak memory); one that fails or passes
``--budget-s`` (plus ``--setup-s`` to load) is recorded with its exact error and the others still run. Variants, with
the preset's GRPO settings (32 rollouts a step, 1024 completion tokens), eval off, on one GridSim bundle: ``kit``,
notebook 03's steps (``train.grpo.run``: its config, its bundle served in the process sandbox from
``--server-processes`` processes with the sessions it needs and a step's more for the expert's step; the model as
``loading.load_model`` loads it; Unsloth's GRPOTrainer with ``env.factory``, ``env.reward_funcs``, ``env.metrics``,
the console live plot) with vLLM's weights the preset's choice for the card; ``kit-4bit``, ``kit-fp8``
and ``kit-16bit``, the same in 4-bit (the recipe's), fp8 and 16-bit (``Preset.vllm_weights``); ``kit-async``, the
preset's own weights through ``train.grpo.trainer.async_grpo_trainer``, Unsloth's AsyncGRPOTrainer, whose generation
overlaps the update; ``bare``, Unsloth's GRPOTrainer with the in-process ``ToyGridSim`` and the recipe's 4-bit, the
floor the kit adds to; ``trl``, stock TRL with bitsandbytes 4-bit (bf16 for "16bit") and a PEFT LoRA on ToyGridSim, what
a user would pick instead. A step splits into generation (``generate`` calls and Unsloth's LoRA load before each, and
of their time vLLM's engine steps, their count and mean; for ``kit-async`` vLLM's engine steps, which overlap the
update), env (inside reset, tools, get_reward; overlaps counted once) and update (the step less TRL's input preparation;
for ``kit-async`` the trainer's training steps), with peak GPU memory. A synchronous variant's steady step is also
printed in parts that add up to it, each with its share and, on a card in ``measure.CARDS`` (its memory bandwidth and
dense 16-bit arithmetic, from NVIDIA's datasheets; no floor on another), the floor of the work it must do (``GB moved``
or ``TFLOP``, ``floor s``) and its time over that (``x floor``): vLLM's engine steps (the bytes of vLLM's weights, each
parameter at their precision, once an engine step, and of the KV cache, 16-bit or fp8, each written token attended to);
generation besides them and the sync (scheduling, sampling, detokenising, adding requests; without vLLM all of
generate; floor 0); the weight sync into vLLM (Unsloth's LoRA load, and for 16-bit weights the fold of the LoRA into
them and their restore; the LoRA tensors read and written, or the folded weights twice); env; the log-prob pass (the old
and reference log-probs TRL scores under no_grad before the update: 2 FLOPs a parameter and scored token); the update
(forward, backward, optimizer: 4 FLOPs a parameter and trained token with LoRA, 6 in full); and the rest of the input
preparation (rewards, TRL's tool-call parsing between rounds, tokenising, advantages). Tokens are the prompt and
completion tokens the step generated, scored and trained. A random model calls no tools, so the kit
also times a step's episodes played with the expert's 3 tool calls each (bench/expert_step.py), in TRL's order and at
once (``env_tools_s``, ``env_tools_concurrent_s``). An OOM is reported with the step reached; a variant stops after the
step past ``--budget-s``. ``--set KEY=VALUE`` changes a GRPO setting for every variant (the 32-at-once rows of
docs/benchmarks.md: ``steps_per_generation=1``); ``--memory-history N`` dumps the CUDA allocator's history of each
variant for ``bench/memory_peak.py``.
Prints markdown; writes ``$OUT/grpo_<preset>[_nocap][TAG].json``, and each variant's log, ``$OUT/grpo_<variant>.log``.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentenv_nb.stack import import_unsloth

VARIANT = sys.argv[sys.argv.index("--variant") + 1] if "--variant" in sys.argv else None  # a variant's own process
# Unsloth before transformers and TRL load, so it patches them; the TRL variant stays stock TRL on a GPU (on a CPU,
# TRL 1.15 can't step without unsloth_zoo's patch). Not in the parent, which only runs the variants and touches no GPU,
# nor where multiprocessing's spawn runs this script again as __mp_main__ (the async trainer's rollout process)
if VARIANT and (VARIANT != "trl" or not torch.cuda.is_available()) and __name__ == "__main__":
    import_unsloth()

import expert_step  # noqa: E402  (bench/, beside this script)
from poll_cost import set_poll_interval  # noqa: E402
from measure import (CARDS, CUDA, GIB, StepTimer, cap_memory, markdown, markdown_rows, out_dir,  # noqa: E402
                     median_steps, run_variant, settings, summary, timed_class, write_report)
from agentenv_nb.tasks.gridsim import battery, write_bundle  # noqa: E402

# vLLM's weights a variant loads (Preset.vllm_weights); None: the preset's own, "24gb"'s being the card's choice (the
# trl variant loads its own way)
WEIGHTS = {"kit": None, "kit-4bit": "4bit", "kit-fp8": "fp8", "kit-16bit": "16bit", "kit-async": None, "bare": "4bit",
           "trl": None}
VARIANTS = tuple(WEIGHTS)


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
    # TRL's input preparation, the step less its update, with the tokens it hands the update; its log-prob pass, the
    # calls under no_grad (stock TRL's update scores through the same method, with grad)
    trainer._prepare_inputs = timer.prepare.wrap(trainer._prepare_inputs, sync=True, count=trained_tokens)
    scored = trainer._get_per_token_logps_and_entropies
    scoring = timer.logps.wrap(scored, sync=True, count=scored_tokens)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (scoring, scored)[torch.is_grad_enabled()](*a, **k)
    if engine := getattr(trainer.model, "vllm_engine", None):  # Unsloth's colocated vLLM: TRL calls its generate
        # the instance's generate: Unsloth wraps it for 16-bit merged-weight rollouts, and vLLM refuses the sentinel
        # LoRA request that wrapper takes when the class's generate is called instead
        engine.generate = timer.gen.wrap(engine.generate, sync=True, count=kv_reads)
        engine.llm_engine.step = timer.engine.wrap(type(engine.llm_engine).step.__get__(engine.llm_engine))
        # The weight sync, counted in generation: Unsloth's load_lora before each generate call, and unsloth_zoo's fold
        # of the LoRA into the 16-bit weights and its restore around the call's engine steps (merged-weight rollouts)
        from unsloth_zoo import vllm_utils
        trainer.model.load_lora = timer.sync.wrap(timer.gen.wrap(trainer.model.load_lora), count=synced_bytes)
        vllm_utils.merged_rollout = timer.sync.wrap_context(vllm_utils.merged_rollout, sync=True)
    trainer.train()


def kv_reads(outputs, *args, **kwargs) -> dict:
    """The KV cache vLLM's decoding read for a generate call's ``outputs``, in tokens: each token it wrote attended to
    its prompt and the tokens written before it."""
    lengths = [(len(output.prompt_token_ids), len(completion.token_ids))
               for output in outputs for completion in output.outputs]
    return {"kv_token_reads": sum(written * prompt + written * (written - 1) // 2 for prompt, written in lengths)}


def trained_tokens(inputs, *args, **kwargs) -> dict:
    """The prompt and completion tokens of the micro-batch TRL's ``_prepare_inputs`` hands the update."""
    return {"update_tokens": int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())}


def scored_tokens(_, model, input_ids, attention_mask, *args, **kwargs) -> dict:
    """The prompt and completion tokens a log-prob pass scores."""
    return {"logps_tokens": int(attention_mask.sum())}


def synced_bytes(request, *args, **kwargs) -> dict:
    """The bytes a weight sync moves, read off what Unsloth's load_lora hands vLLM: a LoRA request's tensors, which
    vLLM copies into its LoRA slots as the call's engine steps start (timed there), read and written once; or a
    merged-weight rollout's state, whose 16-bit weights the fold and the restore each read and write."""
    if tensors := getattr(request, "lora_tensors", None):
        return {"sync_bytes": 2 * sum(tensor.nbytes for tensor in tensors.values())}
    state = getattr(request, "state", None)
    return {"sync_bytes": 4 * sum(weight.nbytes for _, weight, _ in state.entries)} if state else {}



def variant_preset(args):
    """The preset this process's variant trains with: ``--preset`` with vLLM's weights as the variant says, or
    without vLLM (``--no-vllm``)."""
    from agentenv_nb.train import presets
    preset = dataclasses.replace(presets.named(args.preset), **args.preset_set)
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


def kit_run(args, trainer: str = "grpo"):
    """Notebook 03's run (``train.grpo.run.GRPORun``) on the benchmark's bundle, in the process sandbox, with no
    checkpoints and no greedy eval."""
    from agentenv_nb.train.grpo.run import GRPORun

    return GRPORun(bundle=args.bundle, run_dir=f"{args.work}/{args.variant}", trainer=trainer, sandbox="process",
                   save_steps=0, server_processes=args.server_processes, eval_days=0)


def kit_env(run, config, beside: int = 0):
    """The run's bundle served as notebook 03 serves it (``train.run``), holding the sessions the run needs
    (``train.grpo.run.session_limit``) and ``beside`` more (the expert's step after training plays beside the
    trainer's environments)."""
    from agentenv_nb.train.grpo.run import session_limit
    from agentenv_nb.train.run import resolve_bundle, serve

    bundle = resolve_bundle(run)
    return serve(run, bundle, session_limit(run, config, bundle) + beside)


def run_kit(args, timer: StepTimer, result: dict) -> None:
    """Notebook 03's steps (``train.grpo.run``: the config, the bundle served, the model loaded and checked), its
    trainer with the env's calls timed and no eval, then the expert's step on the same servers."""
    from agentenv_nb.train.grpo import run as grpo_run
    from agentenv_nb.train.grpo.trainer import GRPOTrainer
    from agentenv_nb.train.live import live_plot
    run = kit_run(args)
    config = grpo_run.run_config(run, variant_preset(args), args.model, **args.overrides)
    with kit_env(run, config, beside=config.generation_batch_size) as env:
        model, tokenizer, result["model_kwargs"] = load(args.model, variant_preset(args), json.dumps(args.load))
        env.check(tokenizer)
        train(GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                          environment_factory=timed_class(env.factory, timer.env), reward_funcs=env.reward_funcs,
                          callbacks=[env.metrics, live_plot("console"), timer]), timer, result)
        for concurrent in (False, True):  # TRL's loop, then agentenv_nb.train.grpo.trainer's concurrent tool calls
            result.update(expert_step.expert_step(env.factory, env.dataset.to_list(), result["rollouts_per_step"],
                                                  config.generation_batch_size, concurrent))


def run_kit_async(args, timer: StepTimer, result: dict) -> None:
    """Unsloth's AsyncGRPOTrainer through ``train.grpo.trainer.async_grpo_trainer``, the preset's settings it takes: its
    rollout process plays ``env.factory`` pickled, on the same servers as ``kit``."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from agentenv_nb.train.grpo import run as grpo_run
    from agentenv_nb.train.grpo.trainer import async_grpo_trainer
    taken = {field.name for field in dataclasses.fields(AsyncGRPOConfig)}
    result["settings_not_taken"] = sorted(set(args.overrides) - taken)  # e.g. steps_per_generation
    run = kit_run(args, trainer="async")
    config = grpo_run.run_config(run, variant_preset(args), args.model,
                                 **{k: v for k, v in args.overrides.items() if k in taken})
    result["max_inflight_tasks"] = config.max_inflight_tasks  # its rollouts a step: as its steps log them
    with kit_env(run, config) as env:
        model, tokenizer, result["model_kwargs"] = load(args.model, variant_preset(args), json.dumps(args.load))
        env.check(tokenizer)
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
    result["rollouts_per_s"], result["parts"] = rollouts_per_s(result), parts(result, *args.model_shape)
    return result


def rollouts_per_s(result: dict) -> float | None:
    """The rollouts trained on a second over the steady step (``measure.median_steps``, as the step's time): as each
    step logged them where the trainer does (the async trainer's), else the configured rollouts a step."""
    steady = median_steps(result["steps"])
    if not steady:
        return None
    seconds = sum(step["step_s"] for step in steady)
    if all(step.get("batch/samples_per_step") for step in steady):
        return sum(step["batch/samples_per_step"] for step in steady) / seconds
    return result.get("rollouts_per_step") and seconds and result["rollouts_per_step"] * len(steady) / seconds



# vLLM's weights' bytes a parameter, every parameter at its precision's width: a floor (vLLM keeps the embeddings in
# 16-bit, and applies the LoRA to 4-bit and fp8 weights from its own copy, a few MB)
WEIGHT_BYTES = {"16bit": 2, "fp8": 1, "4bit": 0.5}


def parts(result: dict, params: int, kv_token_bytes: float) -> list[dict]:
    """A synchronous variant's steady step in parts that add up to it, each with its share and, on a card in
    ``measure.CARDS``, its floor and its ratio to it: the bytes it must move (``gb``) over the memory bandwidth, the
    FLOPs it must do (``tflop``) over the dense 16-bit peak, or 0; none for env and the rest. ``params``: the model's
    parameters; ``kv_token_bytes``: a token's 16-bit KV cache (vLLM's), half that where the variant loaded an fp8 one
    (``--load float8_kv_cache=true``)."""
    if result.get("steady_gen_rest_s") is None:
        return []
    steady = {key.removeprefix("steady_"): value or 0.0 for key, value in result.items() if key.startswith("steady_")}
    peak = dict(zip(("bytes", "flops"), CARDS.get(result.get("device"), (None, None))))
    loaded = result.get("model_kwargs") or {}
    # The update's FLOPs a parameter and token: 6 in full (forward 2, backward 4); with LoRA on a frozen base 4, the
    # forward and the activations' gradients, the base having no gradients of its own (LoRA's 6 a parameter of its
    # few, attention's, and gradient checkpointing's second forward, a choice, are left out)
    update = 6 if loaded.get("full_finetuning") else 4
    engine = steady["engine_steps"] * params * WEIGHT_BYTES.get(result.get("weights"), 2)
    kv_token_bytes /= 2 if loaded.get("float8_kv_cache") else 1
    rows = [("vLLM's engine steps", "engine_s", engine + steady["kv_token_reads"] * kv_token_bytes, "bytes"),
            ("generation besides the engine steps and the sync", "gen_rest_s", 0.0, None),
            ("weight sync into vLLM", "sync_s", steady["sync_bytes"], "bytes"),
            ("env", "env_s", None, None),
            ("log-prob pass", "logps_s", 2 * params * steady["logps_tokens"], "flops"),
            ("update", "update_s", update * params * steady["update_tokens"], "flops"),
            ("rest of the input preparation", "rest_s", None, None)]
    out = []
    for part, key, work, unit in rows:
        if unit == "bytes" and not steady["engine_steps"]:  # without vLLM, no engine steps nor sync: generation whole
            continue
        floor = (work / peak[unit] if peak[unit] else None) if unit else work
        out.append({"part": part, "s": steady[key], "pct": 100 * steady[key] / steady["step_s"],
                    "gb": work / 1e9 if unit == "bytes" else None, "tflop": work / 1e12 if unit == "flops" else None,
                    "floor_s": floor, "x_floor": steady[key] / floor if floor else None})
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


PART_COLUMNS = [("variant", "variant", 0), ("part of the steady step", "part", 0), ("s", "s", 2),
                ("% of the step", "pct", 1), ("GB moved", "gb", 2), ("TFLOP", "tflop", 2), ("floor s", "floor_s", 3),
                ("x floor", "x_floor", 1)]


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
    split = [{"variant": r["variant"], **part} for r in results for part in r.get("parts", [])]
    return "\n".join(markdown(COLUMNS, results) + [""] + [
        f"- {text}: {value:.2f} (goal <= {limit:g}): {'PASS' if value <= limit else 'FAIL'}"
        for text, value, limit in goals if value] + (["", *markdown_rows(PART_COLUMNS, split)] if split else []))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="the model folder (the random Qwen3-4B-shaped one: "
                        "train.model.tiny.build_random_qwen3_4b)")
    parser.add_argument("--preset", default="24gb", choices=("24gb", "16bit", "cpu-tiny"),
                        help="the preset every variant trains with; the variant names vLLM's weights")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=4, help="the first a warm-up; the steady step the median after it")
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="a variant stops after the steady step that passes it (the first step not counted)")
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
    parser.add_argument("--preset-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of the preset over its own for every variant but trl, VALUE as JSON (else a "
                        "string), e.g. gradient_checkpointing=true or vllm_share_16bit=0.6")
    parser.add_argument("--environ", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of every variant's process, e.g. UNSLOTH_VLLM_STANDBY=1")
    parser.add_argument("--poll-s", type=float, metavar="SECONDS",
                        help="the bundle's prompt_agent poll_interval_seconds (default: GridSim's own)")
    parser.add_argument("--cpus", metavar="LIST",
                        help="run on these CPU cores only, e.g. 0,1 as on a notebook host of 2 cores")
    parser.add_argument("--profile-step", type=int, metavar="N",
                        help="torch.profiler over optimizer step N (2 or later), left out of the steady step: its "
                        "operators and kernels by GPU time in $OUT/profile_<variant><tag>.txt and .json")
    parser.add_argument("--tag", default="", help="appended to the JSON report's name")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing: tiny model, cpu-tiny, 2 steps")
    parser.add_argument("--fake-oom", choices=VARIANTS, help="raise an OOM after that variant's first step")
    for hidden in ("--bundle", "--work", "--variant"):  # set for a variant's own process
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.variants = args.variants.split(",")
    if not set(args.variants) <= set(VARIANTS):
        parser.error(f"--variants takes some of {', '.join(VARIANTS)}")
    from agentenv_nb.train.presets import Preset
    fields = {field.name for field in dataclasses.fields(Preset)} - {"name"}
    args.preset_set = settings(args.preset_set)
    if unknown := sorted(set(args.preset_set) - fields):
        parser.error(f"--preset-set: {', '.join(unknown)} is not a field of the preset; see "
                     "agentenv_nb/train/presets/recipes.py")
    if args.smoke:
        args.preset, args.steps, args.cap_gb = "cpu-tiny", 2, None  # a steady step after the first
    elif not args.model:
        parser.error("--model is required (or --smoke)")
    return args



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
        if args.poll_s is not None:
            set_poll_interval(args.bundle, args.poll_s)
        if args.cpus:  # inherited by the variants' processes and their env servers
            os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
        os.environ.update({key: value for key, _, value in (pair.partition("=") for pair in args.environ)})
    args.overrides = {"output_dir": str(Path(args.work) / f"grpo-{args.variant}"), "max_steps": args.steps,
                      "eval_strategy": "no", "eval_on_start": False, **settings(args.set)}  # every variant's changes
    if args.variant:
        return run_here(args)
    from agentenv_nb.train.presets.vllm_sizing import kv_cache_bytes, parameter_count
    args.model_shape = parameter_count(args.model), kv_cache_bytes(args.model, 1)  # what the parts' floors count
    import importlib.metadata
    import importlib.util
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM: the running variant is killed too
    versions = {m: importlib.metadata.version(m) for m in ("torch", "transformers", "trl", "unsloth", "vllm", "torchao")
                if importlib.util.find_spec(m)}
    report = {"preset": args.preset, "cap_gb": args.cap_gb, "steps": args.steps, "smoke": args.smoke, "device": "cpu",
              "settings": settings(args.set), "load": args.load, "preset_set": args.preset_set,
              "environ": args.environ, "budget_s": args.budget_s,
              "poll_interval_s": args.poll_s, "cpus": sorted(os.sched_getaffinity(0)),
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "versions": versions, "results": []}
    name = f"grpo_{args.preset}{'' if args.cap_gb else '_nocap'}{args.tag}.json"
    for variant in args.variants:
        weights = WEIGHTS[variant] or "the preset's"
        print(f"== {variant} ({args.preset}, vLLM's weights {weights}, cap {args.cap_gb or 'none'} GB, "
              f"{args.steps} steps)", flush=True)
        report["results"].append(result := in_own_process(variant, args))
        report["device"] = result.get("device") or report["device"]
        card = CARDS.get(report["device"])  # the peaks the parts' floors are at
        report["card_peaks"] = card and {"memory_bytes_per_s": card[0], "dense_16bit_flops_per_s": card[1]}
        path = write_report(name, report)  # after each variant: a run cut short keeps what it measured
        print(table([result]), flush=True)
    peaks = report["card_peaks"] and ("floors at {:.2f} TB/s and {:.0f} dense 16-bit TFLOPS".format(
        *(peak / 1e12 for peak in report["card_peaks"].values())))
    print(f"\n## GRPO, {args.preset}, GPU held to {args.cap_gb or 'all'} GB, {report['device']} "
          f"({peaks or 'no floors: a card not in measure.CARDS'})\n\n{table(report['results'])}")
    print(f"\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
