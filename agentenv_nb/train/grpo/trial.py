"""The longest step first: GRPO steps at the run's worst case before training, their peak memory and time against
the card's, said in one line: "fits: peak 19.1 of 24.0 GB; at most about 5 s a step, 4 minutes for 40 steps", or
the preset setting to lower, and to what, where it doesn't fit.

    print(trial.check(model, tokenizer, config, env, preset))   # before fit(trainer); a CPU preset: skipped, said
                                                                # where it doesn't fit: Stop, with that line

The worst case: the split's longest prompt in every row of a step, each rollout made to write ``max_completion_length``
tokens (``min_new_tokens``, or vLLM's ``min_tokens``); as many tool rounds as the model calls. Two such steps: the
first pays the one-off costs (compiling kernels, capturing CUDA graphs), so the second's time is a step's. It costs
those steps and a copy of the trainable weights, which are put back after them (their optimizer is thrown away): the
trial trains nothing.
Before them, with vLLM, the longest prompt and ``max_completion_length`` are checked against the sequence vLLM is
loaded for (``length_problem``): past it, vLLM cuts every long rollout short, and the worst case isn't one.
``verdict`` is the decision alone, from measured numbers.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass

from agentenv_nb.library_log import to_log
from agentenv_nb.stops import Stop
from agentenv_nb.train import presets
from agentenv_nb.train.presets import configs
from agentenv_nb.train.fit import duration

TRIAL_STEPS = 2  # the first compiles and captures; the second is timed


@dataclass(frozen=True)
class Measured:
    """One trial step: its seconds, the peak GPU memory it reserved and the memory held before it (the weights),
    in GB; ``out_of_memory`` when it ran out (the peak then is what the run may use); the completions' mean length
    in tokens, as the trainer logged it."""

    seconds: float
    peak_gb: float
    before_gb: float = 0.0
    out_of_memory: bool = False
    completion_tokens: float = 0.0


def verdict(measured: Measured, allowed_gb: float | None, max_steps: int, batch: int, accumulation: int,
            completion_length: int, headroom: float = 0.95) -> str:
    """One line: whether the step fits ``allowed_gb`` (None: no GPU, time only), the step's and the run's time;
    where it doesn't fit, the setting to lower and to what. The memory above ``before_gb`` is taken to grow with
    the rollouts a micro-batch (``per_device_train_batch_size``), which is halved or more, with
    ``gradient_accumulation_steps`` raised to keep a step's rollouts; at one a micro-batch, ``max_completion_length``
    is lowered instead."""
    run = duration(measured.seconds * max_steps)
    timing = f"at most about {duration(measured.seconds)} a step, {run} for {max_steps} steps"  # the worst case's
    if allowed_gb is None:
        return f"trial step on the CPU: {timing}"
    peak = f"peak {measured.peak_gb:.1f} of {allowed_gb:.1f} GB"
    if not measured.out_of_memory and measured.peak_gb <= headroom * allowed_gb:
        return f"fits: {peak}; {timing}"
    room = max(headroom * allowed_gb - measured.before_gb, 0.0)
    used = max(measured.peak_gb - measured.before_gb, 1e-9)
    share = 0.5 if measured.out_of_memory else min(room / used, 0.5 if room >= used else 1.0)
    said = f"ran out of memory at {measured.peak_gb:.1f} of {allowed_gb:.1f} GB" if measured.out_of_memory else peak
    rollouts = batch * accumulation
    smaller = [b for b in range(batch - 1, 0, -1) if rollouts % b == 0 and b <= batch * share]
    if smaller:
        return (f"doesn't fit: {said}; lower per_device_train_batch_size from {batch} to {smaller[0]} and raise "
                f"gradient_accumulation_steps from {accumulation} to {rollouts // smaller[0]} (the same "
                f"{rollouts} rollouts a step, {batch // smaller[0]}x the time to train them)")
    length = max(16, int(completion_length * share) // 16 * 16)
    return f"doesn't fit: {said}; lower max_completion_length from {completion_length} to {length}"


def length_problem(prompt_tokens: int, completion_length: int, max_seq_length: int) -> str | None:
    """Where the longest prompt and a rollout's budget exceed the sequence vLLM is loaded for (Unsloth's
    ``max_seq_length``, vLLM's ``max_model_len``), which would cut rollouts short of ``max_completion_length``: the
    line saying the length to lower it to."""
    if prompt_tokens + completion_length <= max_seq_length:
        return None
    room = (max_seq_length - prompt_tokens) // 16 * 16
    fix = f"lower max_completion_length from {completion_length} to {room}" if room >= 16 else "shorten the prompts"
    return (f"doesn't fit: the longest prompt's {prompt_tokens} tokens and max_completion_length {completion_length} "
            f"exceed max_seq_length {max_seq_length}, the longest sequence vLLM is loaded for; {fix}")


def longest_prompt(env, tokenizer, config) -> tuple[int, int]:
    """The index of the training split's row with the longest prompt, and that prompt's length in tokens, as the
    trainer renders it."""
    kwargs = getattr(config, "chat_template_kwargs", None) or {}
    lengths = [len(tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True,
                                                 return_dict=False, **kwargs)) for row in env.dataset]
    index = max(range(len(lengths)), key=lengths.__getitem__)
    return index, lengths[index]


def trial_step(model, tokenizer, config, env, longest: int) -> Measured:
    """Train ``TRIAL_STEPS`` steps at the worst case, every row the split's ``longest`` (``longest_prompt``), on a
    trainer of its own (the kit's, as ``grpo.trainer_for`` makes it), putting the trainable weights back after them;
    the last step's time (TRL's ``step_time``) is the step's."""
    import torch

    from agentenv_nb.train.grpo.trainer import trainer_for

    rows_a_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    length = config.max_completion_length
    full = {"min_tokens": length} if config.use_vllm else {"min_new_tokens": length}
    with tempfile.TemporaryDirectory() as scratch:
        weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_reserved() / 1e9 if gpu else 0.0
        with to_log("the trial step"):  # Unsloth's notes on its config, its trainer's table and prints: the log's
            trial = dataclasses.replace(
                config, output_dir=scratch, max_steps=TRIAL_STEPS, eval_strategy="no", eval_on_start=False,
                eval_steps=None, save_strategy="no", report_to="none", logging_steps=1, resume_from_checkpoint=None,
                disable_tqdm=True,  # its logs as lines in the library log, not a bar (in a notebook, HTML objects)
                # the run's scaling: made again from "group", Unsloth's config would turn it off for dr_grpo
                scale_rewards=configs.scale_rewards_argument(config.scale_rewards, config.loss_type),
                generation_batch_size=None,  # TRL derives it again from steps_per_generation, and refuses both set
                generation_kwargs={**(config.generation_kwargs or {}), **full})
            trainer = trainer_for(model, tokenizer, trial, env, callbacks=[])
        trainer.train_dataset = env.dataset.select([longest] * rows_a_step * TRIAL_STEPS)
        start, out_of_memory = time.perf_counter(), False
        try:
            with to_log("the trial step"):
                trainer.train()
        except torch.OutOfMemoryError:
            out_of_memory = True
        steps = [log["step_time"] for log in trainer.state.log_history if "step_time" in log]
        seconds = steps[-1] if steps else (time.perf_counter() - start) / TRIAL_STEPS
        peak = torch.cuda.max_memory_reserved() / 1e9 if gpu else 0.0
        lengths = [log["completions/mean_length"] for log in trainer.state.log_history
                   if "completions/mean_length" in log]
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in weights:
                    p.copy_(weights[name])
        for environment in trainer.environments or ():  # their sessions, which the run's own trainer needs
            environment.__exit__(None, None, None)
        env.metrics.discard()  # the trial's scores and rollouts are no step of the run
        del trainer
        if gpu:
            torch.cuda.empty_cache()
    return Measured(seconds, peak, before, out_of_memory, lengths[-1] if lengths else 0.0)


def check(model, tokenizer, config, env, preset, force: bool = False) -> str:
    """The trial step's line for this run, or, on a CPU preset (unless ``force``), that it is skipped. Where the step
    doesn't fit, ``Stop`` with that line: the run would run out of memory at its longest step, so none is trained."""
    if preset.gpu_gb is None and not force:
        return f"trial step skipped: {preset.name} is a CPU preset (it measures a GPU's memory)"
    if type(config).__name__ == "AsyncGRPOConfig":
        return "trial step skipped: TRL's async trainer generates in another process, out of this step's reach"
    allowed = None
    import torch

    if torch.cuda.is_available():
        from agentenv_nb.train.presets.vllm_sizing import gpu_memory

        card, cap = gpu_memory()
        allowed = (cap or card) / 1e9
    longest, prompt_tokens = longest_prompt(env, tokenizer, config)
    if config.use_vllm and (problem := length_problem(prompt_tokens, config.max_completion_length,
                                                      preset.max_seq_length)):
        raise Stop(problem)  # vLLM would stop every long rollout at its max_model_len: the trial would measure less
    measured = trial_step(model, tokenizer, config, env, longest)
    line = verdict(measured, allowed, config.max_steps, config.per_device_train_batch_size,
                   config.gradient_accumulation_steps, config.max_completion_length)
    if line.startswith("doesn't fit"):
        raise Stop(line)
    return line
