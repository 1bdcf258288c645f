"""Where notebook 02's warm start learns from, picked for the bundle: its expert where a task adapter has one, else the
demonstrations a user gives (a JSONL, ``train.warm_start.user_demos``), else the model's own best rollouts
(self-distillation); and whether it learnt.

    start = choose(bundle, env, demos="my-demos.jsonl")   # says which, and why
    train_set = start.sft_dataset(model, tokenizer, env, "cpu-tiny")
    check_learned(summary(played), preset)                # Stop in one line where it didn't; on the CPU a warning
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agentenv_nb.stops import Stop
from agentenv_nb.tasks.adapters import adapter_for
from agentenv_nb.train.warm_start import demos as demo_data
from agentenv_nb.train import presets
from agentenv_nb.train.naming import NOTEBOOK, Naming
from agentenv_nb.train.rollout import Rollout
from agentenv_nb.train.warm_start.user_demos import read_demonstrations

EXPERT, DEMONSTRATIONS, SELF_DISTILLATION = "expert", "demonstrations", "self-distillation"
TOOL_CALL_RATE = 0.5  # the share of eval tasks with a tool call below which the warm start didn't learn the tools
TINY_CANT = ("expected on the CPU preset: the tiny random model, or a real one in the few SFT steps a CPU takes, learns "
             "the form of a tool call from the demonstrations, not the answers, so where the verifiers give no partial "
             "credit it scores 0 on the CPU. The warm start is saved and the run goes on; on a GPU preset this stops "
             "the run")


@dataclass
class WarmStart:
    """What the warm start learns from (``source``), why that (``why``), and the conversations it learns from:
    known at once for an expert or a file, the model's own rollouts for self-distillation (``sft_dataset``)."""

    source: str
    why: str
    demonstrations: list[Rollout] = field(default_factory=list)

    def sft_dataset(self, model, tokenizer, env, preset: presets.Preset | str, *, samples: int = 2,
                    fraction: float = 0.5, **play_kwargs):
        """TRL's SFT set of the demonstrations that ``model`` can learn from at ``preset``'s SFT length (``Stop``, in
        one line, where too few can: ``learnable``). For self-distillation they are played first: each train task
        ``samples`` times at the preset's GRPO temperature, the top ``fraction`` of those scoring above 0 kept."""
        if self.source == SELF_DISTILLATION:
            rollouts, self.demonstrations = demo_data.best_rollouts(model, tokenizer, env, preset, fraction=fraction,
                                                                    samples=samples, **play_kwargs)
            if not self.demonstrations:
                raise ValueError(f"none of the model's {len(rollouts)} rollouts of the train tasks scored above 0, so "
                                 "it has nothing of its own to learn from: give DEMOS, a JSONL of demonstrations")
        return demo_data.sft_dataset(self.demonstrations, tokenizer, preset, model)


def choose(bundle: str | Path, env, demos: str | Path = "") -> WarmStart:
    """The warm start ``bundle`` allows, said in one printed line: the task adapter's expert, played on ``env``'s
    train tasks and kept where the verifier scored 1; else ``demos``, checked against ``env``'s tools; else
    self-distillation."""
    adapter = adapter_for(bundle)
    expert = adapter.expert() if adapter else None
    if expert is not None:
        played = demo_data.expert_demonstrations(expert, env.factory, env.dataset, concurrency=env.max_concurrent_envs)
        kept = [d for d in played if d["reward"] == 1.0]
        start = WarmStart(EXPERT, f"{adapter.name}'s task adapter has an expert: {len(kept)} of its {len(played)} "
                                  "episodes scored 1.0", kept)
    elif demos:
        given = read_demonstrations(demos, env.factories)
        start = WarmStart(DEMONSTRATIONS, f"{len(given)} demonstrations from {Path(demos).name}, each fitting the "
                                          "bundle's tools", given)
    else:
        start = WarmStart(SELF_DISTILLATION, "no task adapter with an expert knows this bundle and no DEMOS file "
                                             "was given: the model learns from its own best rollouts")
    print(f"warm start from {start.source}: {start.why}")
    return start


def learning_problem(scored: dict[str, float], naming: Naming = NOTEBOOK) -> str | None:
    """None where the warm start learnt (``rollout.summary`` of its greedy eval: a tool call in at least half the
    tasks, a reward above 0); else what it missed and what to do, in one line, in ``naming``'s words."""
    if scored["tool_call_rate"] < TOOL_CALL_RATE:
        return (f"the model called a tool in {scored['tool_call_rate']:.0%} of the eval tasks: give SFT more "
                f"demonstrations or more steps ({naming.name('sft_steps')})")
    if not scored["reward"] > 0:
        return ("the model's answers scored nothing on the eval tasks: give SFT more demonstrations (a small model: "
                "200+)")
    return None


def check_learned(scored: dict[str, float], preset: presets.Preset, naming: Naming = NOTEBOOK) -> None:
    """Stop, in one line that says what to do (in ``naming``'s words), where the warm start didn't learn
    (``learning_problem``); on a CPU preset print it as a warning with its reason, and go on: the tiny model learns
    the form, not the task."""
    if (problem := learning_problem(scored, naming)) is None:
        return
    if not preset.on_cpu:
        raise Stop(problem)
    print(f"warning: {problem}. This is {TINY_CANT}.")
