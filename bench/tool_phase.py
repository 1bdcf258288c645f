"""The tool phase of a GRPO turn on CPU: ``rollouts`` rollouts, each making ``calls`` calls to a tool that takes
``seconds``, through TRL's GRPOTrainer (rollout after rollout) and the kit's (``agentenv_nb.train.grpo.trainer``, at
once).

    python bench/tool_phase.py --rollouts 16 --calls 3 --seconds 0.3 --repeats 5   # the table docs/benchmarks.md shows

The env is agent_env's echo example with a ``slow_echo`` tool that sleeps, served by ``AgentEnv.local`` with the
process sandbox. Each repeat resets every environment (and waits for its episode to start, which isn't the tool
phase), hands ``_tool_call_loop`` one assistant message a rollout holding the calls, and times from the loop's start
to its first post-tool generation: the tool phase. The trainer is built on the tiny offline model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import agent_env

from agentenv_nb import AgentEnv
from agentenv_nb.client.environment import player_of

KIT = "agentenv_nb.train.grpo.trainer.GRPOTrainer"

SERVER = '''
import time
from typing import Annotated
from pydantic import Field
from agentenv_protocol import AgentEnvEnvironment, environment_card, tool


@environment_card(name="echo")
class EchoEnv(AgentEnvEnvironment):
    @tool(name="slow_echo")
    def slow_echo(self, text: Annotated[str, Field(description="The text to send back.")]) -> str:
        """Return the text it's sent, after SECONDS s."""
        time.sleep(SECONDS)
        return text


if __name__ == "__main__":
    EchoEnv().serve()
'''
STEPS = [{"id": "env", "type": "deploy_env", "env_id": "echo"},
         {"id": "agent", "type": "deploy_agent", "agent_name": "player", "env_ids": ["echo"]},
         {"id": "turn", "type": "prompt_agent", "agent_name": "player", "poll_interval_seconds": 0.1,
          "prompt": "Echo 'hi' three times."}]


def write_bundle(root: Path, seconds: float) -> Path:
    """The echo example's env with a tool that takes ``seconds``, and one task that deploys it."""
    env = root / "envs" / "echo"
    shutil.copytree(Path(agent_env.__file__).parent / "examples" / "echo-mcp" / "envs" / "echo", env,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (env / "env.toml").write_text('env_provider_type = "server"\n')
    (env / "server.py").write_text(SERVER.replace("SECONDS", repr(seconds)))
    (root / "tasks").mkdir()
    (root / "tasks" / "echo.json").write_text(json.dumps(STEPS))
    return root


def trainer_of(cls, model_path: Path, out: Path, env: AgentEnv, rollouts: int):
    """A GRPO trainer of class ``cls`` on the tiny model, playing ``env``'s tasks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=rollouts, num_generations=rollouts,
                      max_completion_length=256, max_tool_calling_iterations=1, report_to="none", use_cpu=True,
                      bf16=False, chat_template_kwargs={"enable_thinking": False})
    return cls(model=AutoModelForCausalLM.from_pretrained(model_path), args=args, train_dataset=env.dataset,
               processing_class=AutoTokenizer.from_pretrained(model_path), environment_factory=env.factory,
               reward_funcs=env.reward_funcs)


def tool_phase(trainer, environments: list, row: dict, calls: int) -> float:
    """Seconds from the loop's start to its post-tool generation, for one assistant message a rollout."""
    for environment in environments:
        environment.reset(**row)
    for environment in environments:
        player_of(environment).episode.started.result(300)
    # The tool dicts TRL builds for the batch in _generate_and_score_completions: the environment's tools.
    trainer._sync_tool_dicts = [{"slow_echo": environment.slow_echo} for environment in environments]
    trainer._async_tool_dicts = [{} for _ in environments]
    call = {"type": "function", "function": {"name": "slow_echo", "arguments": {"text": "hi"}}}
    message = {"role": "assistant", "content": "", "tool_calls": [call] * calls}
    prompts = [list(row["prompt"]) for _ in environments]
    prompt_ids = [trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True,
                                                               enable_thinking=False)["input_ids"] for prompt in prompts]
    completion_ids = [trainer.processing_class(json.dumps(message))["input_ids"] for _ in environments]
    generate, marks = trainer._generate_single_turn, []

    def timed_generation(*args, **kwargs):
        marks.append(time.perf_counter())
        return generate(*args, **kwargs)

    trainer._generate_single_turn = timed_generation
    try:
        start = time.perf_counter()
        trainer._tool_call_loop(prompts, prompt_ids, completion_ids, [[dict(message)] for _ in environments],
                                None, None, None)
    finally:
        del trainer._generate_single_turn
    return marks[0] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3, help="tool calls a rollout, in one assistant message")
    parser.add_argument("--seconds", type=float, default=0.3, help="how long the tool takes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from agentenv_nb.train.grpo.trainer import GRPOTrainer  # imports unsloth, then trl
    from agentenv_nb.train.model.tiny import build_tiny_model
    from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer

    with tempfile.TemporaryDirectory() as folder, AgentEnv.local(
            write_bundle(Path(folder) / "slow-echo", args.seconds), split="all", sandbox="process",
            max_concurrent_envs=args.rollouts + 2) as env:
        model = build_tiny_model(Path(folder) / "tiny")
        environments = [env.factory() for _ in range(args.rollouts)]
        times = {}
        for name, cls in (("TRL's GRPOTrainer", TRLGRPOTrainer), (KIT, GRPOTrainer)):
            trainer = trainer_of(cls, model, Path(folder) / "out", env, args.rollouts)
            times[name] = [tool_phase(trainer, environments, env.dataset[0], args.calls) for _ in range(args.repeats)]
        for environment in environments:
            environment.__exit__()
    serial = args.rollouts * args.calls * args.seconds
    print(f"{args.rollouts} rollouts x {args.calls} calls x {args.seconds:g} s tool (one at a time: {serial:.1f} s), "
          f"median of {args.repeats}\n")
    print("| trainer | tool phase of a turn (s) | min | max |\n|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {statistics.median(seconds):.2f} | {min(seconds):.2f} | {max(seconds):.2f} |")
    ratio = statistics.median(times["TRL's GRPOTrainer"]) / statistics.median(times[KIT])
    print(f"\nspeed-up: {ratio:.1f}x")


if __name__ == "__main__":
    main()
