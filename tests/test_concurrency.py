"""Rollouts at full concurrency: environments played from many threads at once each keep their own reward, and the
kit's GRPOTrainer (``agentenv_nb.train.grpo.trainer``) runs a batch's tool calls at once with TRL's results, counts and
roll-back, and the same rewards in a seeded run. Real servers on loopback, the tiny model, real GRPO steps."""

import logging
import threading
import time

import pytest

from .conftest import TRAINERS, grpo, step_logs, trainer_class, warnings

from agentenv_nb import AgentEnv


@pytest.fixture(scope="module")
def served(answers):
    """conftest's ``answers`` on loopback, ten sessions at once."""
    with AgentEnv.local(answers, max_concurrent_envs=10) as env:
        yield env


def play_one(env: AgentEnv, row: dict, reply: str, wait: float = 0.0) -> float | None:
    with env.factory() as play:
        play.reset(**row)
        time.sleep(wait)  # another thread reads its reward meanwhile
        play.end_turn(response=reply)
        return play.get_reward()


def test_many_threads_playing_at_once_each_keep_their_own_reward(served, caplog):
    rows = served.dataset.to_list()
    asked = [row["prompt"][-1]["content"].removeprefix("Say ").removesuffix(".") for row in rows]
    games = [(rows[i % 4], f"it is {asked[i % 4]}" if i % 2 else "no", 0.05 * (i % 4)) for i in range(8)]
    alone = [play_one(served, *game) for game in games]
    together, gate = [None] * len(games), threading.Barrier(len(games))

    def player(i: int) -> None:
        gate.wait()
        together[i] = play_one(served, *games[i])

    threads = [threading.Thread(target=player, args=(i,)) for i in range(len(games))]
    with caplog.at_level(logging.WARNING):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert together == alone and set(alone) == {0.5, 1.0}  # "no" has a letter: 0.5; the answer: 1.0
    assert "unscored" not in warnings(caplog)


def test_get_reward_before_any_episode_says_to_reset(served):
    with served.factory() as play, pytest.raises(RuntimeError, match=r"before any episode: call reset\(\*\*row\)"):
        play.get_reward()


class Ledger:
    """A plain-Python environment: ``write`` takes a moment and numbers what it writes, ``fail`` raises."""

    def reset(self, **row):
        self.lines, self.threads = [], set()

    def write(self, text: str) -> str:
        """Write a line.

        Args:
            text: The line.
        """
        time.sleep(0.05)
        self.lines.append(text)
        self.threads.add(threading.get_ident())
        return f"{len(self.lines)}: {text}"

    def fail(self, reason: str) -> str:
        """Fail.

        Args:
            reason: Why.
        """
        raise ValueError(reason)


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def run_tool_loop(trainer, environments: list[Ledger]) -> tuple[list, int, int]:
    """One round of TRL's tool loop over handmade completions: calls in order, a failure, an unknown tool, a
    non-function call, a rollout with no calls, and one whose results overflow the completion budget."""
    import torch

    plans = [[call("write", text=f"a{i}"), call("fail", reason=f"no {i}"), call("missing"), call("write", text=f"b{i}")]
             for i in range(4)]
    plans += [[{"type": "code", "name": "shell"}, call("write", text="c")], [], [call("write", text="x y " * 300)]]
    completions = [[{"role": "assistant", "content": "", **({"tool_calls": plan} if plan else {})}] for plan in plans]
    tokenizer = trainer.processing_class
    prompt = [{"role": "user", "content": "Write."}]
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
    for environment in environments:
        environment.reset()
    trainer._sync_tool_dicts = [{"write": e.write, "fail": e.fail} for e in environments]
    trainer._async_tool_dicts = [{} for _ in environments]
    torch.manual_seed(0)
    _, completions, _, _, calls, failures, _ = trainer._tool_call_loop(
        [list(prompt) for _ in plans], [list(prompt_ids) for _ in plans], [[1, 2] for _ in plans], completions,
        None, None, None)
    return [[m for m in c if m["role"] == "tool"] for c in completions], calls, failures


@pytest.mark.slow
def test_the_kit_trainer_runs_a_batch_s_tool_calls_at_once_with_trl_s_results(tiny_model, tmp_path):
    trainer_class("trl")  # unsloth first
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    outcomes = {}
    for name in TRAINERS:
        args = GRPOConfig(output_dir=str(tmp_path / name), max_completion_length=256, max_tool_calling_iterations=1,
                          report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
                          num_generations=2)
        trainer = trainer_class(name)(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args,
                                      processing_class=AutoTokenizer.from_pretrained(tiny_model),
                                      train_dataset=Dataset.from_list([{"prompt": "Write."}]), environment_factory=Ledger,
                                      reward_funcs=[lambda completions, **_: [0.0] * len(completions)])
        environments = [Ledger() for _ in range(7)]
        outcomes[name] = (*run_tool_loop(trainer, environments), [e.lines for e in environments],
                          set().union(*(e.threads for e in environments)))
    (trl_tools, *trl_counts, trl_lines, trl_threads), (kit_tools, *kit_counts, kit_lines, kit_threads) = (
        outcomes["trl"], outcomes["kit"])
    assert kit_tools == trl_tools and kit_counts == trl_counts == [19, 9] and kit_lines == trl_lines
    assert [m["content"] for m in kit_tools[0]] == ["1: a0", "{'error': 'no 0'}", "{'error': 'Tool missing not found.'}",
                                                    "2: b0"]
    assert kit_tools[4][0]["content"] == "{'error': 'Unsupported tool call type: code'}" and kit_tools[5] == []
    assert kit_tools[6] == [] and kit_lines[6] == ["x y " * 300]  # ran, then rolled back past the budget, as in TRL
    assert len(trl_threads) == 1 and len(kit_threads) > 1  # one rollout after another; at once


@pytest.mark.slow
def test_a_seeded_run_gives_the_same_rewards_through_either_trainer(served, tiny_model, tmp_path):
    runs = {}
    for name in TRAINERS:
        env = AgentEnv(served.url, plain_text_replies=True, token=served.token)
        trainer = grpo(tiny_model, tmp_path / name, dataset=env.dataset, factory=env.factory, steps=2,
                       reward_funcs=env.reward_funcs, callbacks=[env.metrics], trainer=name)
        trainer.train()
        env.close()
        runs[name] = [(log["rewards/answers/mean"], log["scores/answers/unscored"])
                      for log in step_logs(trainer, "rewards/answers/mean")]
    assert runs["kit"] == runs["trl"] and len(runs["trl"]) == 2 and all(unscored == 0 for _, unscored in runs["trl"])
