"""The kit's two GRPO trainers. ``GRPOTrainer``: TRL 1.15's (Unsloth's rewrite of it, once ``import_unsloth()``
ran) with a generation batch's tool calls run at once: TRL's loop calls them rollout after rollout, each waiting for
the last. ``async_grpo_trainer``: Unsloth's AsyncGRPOTrainer on one GPU, which generates the next rollouts on the
model's own vLLM while this step's update runs, so a step tends to the longer of the two instead of their sum.

    from agentenv_nb.train.grpo.trainer import GRPOTrainer      # instead of `from trl import GRPOTrainer`
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                          environment_factory=env.factory, reward_funcs=env.reward_funcs, callbacks=[env.metrics])

    config = presets.async_grpo_config("24gb", output_dir="out", max_steps=40)     # or, generating ahead:
    trainer = async_grpo_trainer(model, tokenizer, config, env, callbacks=[live])  # a model loaded with vLLM

    config = presets.trainer_config(TRAINER, "24gb", output_dir="out")   # TRAINER "grpo" or "async", as notebook 03
    trainer = trainer_for(model, tokenizer, config, env, callbacks=[env.metrics, live])   # the config's trainer

TRL's loop stays as it is (``max_tool_calling_iterations``, the roll-back of tool results past the completion budget,
``tools/call_frequency`` and ``tools/failure_frequency``): the first tool it calls in a round runs every rollout's
calls of that round, a thread a rollout and in order within it, and each call TRL then makes gets its result, or
raises its exception, which TRL hands the model as the tool's error. The environments' turn ends and rewards already
run at once (``client.player``). https://www.agentenvframework.com/docs/training/trl.md
"""

from __future__ import annotations

import functools
import sys
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentenv_nb.stack import import_unsloth

import_unsloth()  # first: after it, trl.GRPOTrainer is Unsloth's rewrite wherever Unsloth rewrites it

import trl  # noqa: E402


class ToolRounds:
    """One ``_tool_call_loop``'s sync tools, as per-rollout dicts that answer from rounds run at once.

    A round runs, for every rollout, the calls of its last assistant message that TRL will make (a function call to
    a sync tool of its dict, with keyword arguments) and that no round ran yet."""

    def __init__(self, completions: list[list[dict]], tool_dicts: list[dict[str, Callable]]):
        self.completions, self.originals = completions, tool_dicts
        self.answers: list[deque] = [deque() for _ in completions]
        self.played: list[dict] = []  # the assistant messages whose calls ran (kept, so their ids stay theirs)
        self.tool_dicts = [{name: functools.partial(self.answer, rollout, name) for name in tools}
                           for rollout, tools in enumerate(tool_dicts)]

    def answer(self, rollout: int, name: str, /, **arguments: Any) -> Any:
        """What the call ``name(**arguments)`` of ``rollout`` returned in its round; raises what it raised."""
        if not self.answers[rollout]:
            self.run_round()
        ran, ran_arguments, outcome = self.answers[rollout].popleft() if self.answers[rollout] else (None, None, None)
        if (ran, ran_arguments) != (name, arguments):
            raise RuntimeError(f"agentenv_nb's tool rounds lost step with TRL's loop (ran {ran}, TRL asked for "
                               f"{name}): check that trl is the pinned 1.15.0, or use trl.GRPOTrainer")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def run_round(self) -> None:
        calls = {rollout: pending for rollout in range(len(self.completions))
                 if (pending := self.pending_calls(rollout))}
        with ThreadPoolExecutor(max(len(calls), 1), thread_name_prefix="agentenv_nb-tools") as threads:
            for rollout, answers in zip(calls, threads.map(self.play, calls, calls.values())):
                self.answers[rollout].extend(answers)

    def pending_calls(self, rollout: int) -> list[tuple[str, dict]]:
        messages = self.completions[rollout]
        last = messages[-1] if messages else None
        if not isinstance(last, dict) or not last.get("tool_calls") or any(last is m for m in self.played):
            return []
        self.played.append(last)
        calls = [(call["function"]["name"], call["function"].get("arguments")) for call in last["tool_calls"]
                 if call.get("type") == "function"]
        return [(name, dict(arguments)) for name, arguments in calls
                if name in self.originals[rollout] and isinstance(arguments, Mapping)]

    def play(self, rollout: int, calls: list[tuple[str, dict]]) -> list[tuple[str, dict, Any]]:
        """Make ``rollout``'s calls in order, keeping each result or the exception it raised."""
        answers = []
        for name, arguments in calls:
            try:
                outcome = self.originals[rollout][name](**arguments)
            except Exception as e:  # TRL hands the model str(e) as the tool's result
                outcome = e
            answers.append((name, arguments, outcome))
        return answers


class GRPOTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` whose tool calls run at once across the generation batch; everything else is TRL's."""

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        rounds = ToolRounds(completions, self._sync_tool_dicts)
        self._sync_tool_dicts = rounds.tool_dicts
        try:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images,
                                           multimodal_fields)
        finally:
            self._sync_tool_dicts = rounds.originals


def async_grpo_trainer(model, processing_class, args, env, callbacks=()):
    """Unsloth's AsyncGRPOTrainer (TRL 1.15's ``trl.experimental.async_grpo``, which Unsloth patches to serve the
    model's own vLLM engine on localhost) training on ``env``'s tasks, with ``args`` from
    ``presets.async_grpo_config``. It needs what Unsloth asks of it: the model loaded with vLLM
    (``fast_inference``, as ``loading.load_model`` does on a GPU where vLLM imports) and LoRA. Its rollout process
    plays ``env.factory`` (pickled), a session a rollout in flight, so ``args.max_inflight_tasks`` is at most the
    servers' sessions. Each rollout's reward is its env's; eval and per-score metrics are GRPOTrainer's only."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from agentenv_nb.train.rollout import generator
    from agentenv_nb.train.sessions import capacity_problem

    if generator(model) != "vllm":
        raise ValueError("async_grpo_trainer generates on the model's own vLLM engine, and this model has none: load "
                         "it with a preset that generates on vLLM (fast_inference), on a GPU where vLLM imports")
    if env.rules.plain_text_replies:
        raise ValueError("plain_text_replies needs GRPOTrainer: TRL's AsyncGRPOTrainer hands reward functions no "
                         "environments, so a plain-text reply can't reach its task; make the AgentEnv without it")
    if env.max_concurrent_envs is not None and (
            problem := capacity_problem(args, env.max_concurrent_envs, len(env.factories))):  # a pool a class
        raise ValueError(problem)
    return AsyncGRPOTrainer(model=model, processing_class=processing_class, args=args, train_dataset=env.dataset,
                            environment_factory=env.factory, reward_funcs=env.reward_funcs, callbacks=list(callbacks))


def trainer_for(model, processing_class, args, env, callbacks=()):
    """The trainer ``args`` configures (``presets.trainer_config``) training ``model`` on ``env``'s tasks: for a
    GRPOConfig, ``GRPOTrainer`` evaluating on the eval split every ``eval_steps``; for an AsyncGRPOConfig,
    ``async_grpo_trainer`` (no eval loop)."""
    async_grpo = sys.modules.get("trl.experimental.async_grpo")  # imported wherever an AsyncGRPOConfig was made
    if async_grpo is not None and isinstance(args, async_grpo.AsyncGRPOConfig):
        return async_grpo_trainer(model, processing_class, args, env, callbacks)
    return GRPOTrainer(model=model, processing_class=processing_class, args=args, train_dataset=env.dataset,
                       eval_dataset=env.dataset_for("eval"), environment_factory=env.factory,
                       reward_funcs=env.reward_funcs, callbacks=list(callbacks))
