"""``reward=`` by name or a picklable combinator, which reaches server processes, and a user's demonstrations checked
against a bundle's tools, each mistake one line naming the line of the file and what to do."""

import json
import pickle

import pytest

from agentenv_nb.envs import rewards
from agentenv_nb.train.warm_start.user_demos import DemonstrationError, read_demonstrations

SCORES = {"answer": 1.0, "follow_up": 0.5}


def test_a_reward_by_name_or_weights_combines_the_scores_and_pickles():
    assert rewards.rule("mean")(SCORES) == 0.75
    assert rewards.rule("min")(SCORES) == 0.5 and rewards.rule("max")(SCORES) == 1.0
    assert rewards.rule("answer") == "answer"  # a step id: agent_env checks every task records it
    weighted = rewards.Weighted({"answer": 3, "follow_up": 1})
    assert weighted(SCORES) == pytest.approx(0.875)
    for reward in ("mean", rewards.mean, weighted):
        assert rewards.unpickled(rewards.pickled(reward)) == reward
    with pytest.raises(LookupError, match="no score at follow_up"):
        weighted({"answer": 1.0})
    with pytest.raises(LookupError, match="no score"):
        rewards.mean({})


def test_a_lambda_is_refused_for_server_processes_before_any_starts(tmp_path):
    from agentenv_nb.envs.serve.processes import serve_in_processes

    with pytest.raises(ValueError, match="can't reach a server process.*Weighted"):
        serve_in_processes(tmp_path / "no-bundle", processes=2, reward=lambda scores: 1.0)
    assert pickle.loads(pickle.dumps(rewards.Weighted({"a": 1}))) == rewards.Weighted({"a": 1})


def _factories():
    from agentenv_nb.client.environment import environment_class

    add = {"name": "add", "description": "The sum of two integers.",
           "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}}
    end = {"name": "end_turn", "description": "End your turn.",
           "input_schema": {"type": "object", "properties": {"response": {"type": "string"}}}}
    return {"calc": environment_class("calc", (add, end), None, None)}


def _call(name, **arguments):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _write(tmp_path, *conversations):
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def test_demonstrations_get_the_bundles_tools_and_misfits_name_their_line(tmp_path):
    good = [{"role": "user", "content": "3 plus 4?"}, _call("add", a=3, b=4),
            {"role": "tool", "name": "add", "content": "7"}, _call("end_turn", response="7")]
    [demo] = read_demonstrations(_write(tmp_path, good), _factories())
    assert [t["function"]["name"] for t in demo["tools"]] == ["add", "end_turn"] and demo["tool_calls"] == 2
    from agentenv_nb.train.warm_start.demos import sft_dataset

    assert sft_dataset([demo])[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": 3, "b": 4}'

    cases = {"'mul', which no toolset offers": [*good[:1], _call("mul", a=1, b=2)],
             "add has no argument 'c'": [*good[:1], _call("add", a=1, b=2, c=3)],
             "add needs 'b'": [*good[:1], _call("add", a=1)],
             "no assistant message": good[:1],
             "role 'robot'": [*good, {"role": "robot", "content": "hi"}]}
    for why, conversation in cases.items():
        with pytest.raises(DemonstrationError, match=f"demos.jsonl line 2: .*{why}"):
            read_demonstrations(_write(tmp_path, good, conversation), _factories())
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DemonstrationError, match="bad.jsonl line 1"):
        read_demonstrations(tmp_path / "bad.jsonl", _factories())
    with pytest.raises(DemonstrationError, match='set DEMOS=""'):
        read_demonstrations(tmp_path / "missing.jsonl", _factories())
