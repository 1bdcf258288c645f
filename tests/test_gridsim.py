"""GridSim's rules, optimum, baselines and generator, checked without a server."""

import itertools
import json
import random

import pytest

from agentenv_nb.tasks import bundles, gridsim
from agentenv_nb.tasks.gridsim import battery
from agentenv_nb.tasks.gridsim.prices import synthetic_days


def test_optimum_matches_brute_force_on_short_horizons():
    rng = random.Random(7)
    for _ in range(150):
        prices = [round(rng.uniform(-30, 150), 2) for _ in range(rng.randint(1, 7))]
        brute = max(battery.settle(prices, list(s))[0] for s in itertools.product(battery.ACTIONS, repeat=len(prices)))
        best, schedule = battery.optimum(prices)
        assert best == pytest.approx(brute)
        assert battery.settle(prices, schedule)[0] == pytest.approx(best)


def test_score_rule_idle_optimum_malformed_and_losses():
    prices = synthetic_days(1, seed=3)[0]["prices"]
    assert battery.score(prices, [0] * 24) == pytest.approx(0.2)
    assert battery.score(prices, battery.optimal_schedule(prices)) == pytest.approx(1.0)
    for bad in ([1] * 23, [2] * 24, "charge", [0.5] * 24, [True] * 24, None):
        assert battery.score(prices, bad) == 0.0
    buys_dear = [0] * 24
    buys_dear[max(range(24), key=prices.__getitem__)] = 1  # buys at the day's dearest hour, never sells
    assert battery.score(prices, buys_dear) < 0.2


def test_impossible_actions_do_nothing():
    profit, taken = battery.settle([10.0] * 24, [-1] + [1] * 6 + [0] * 17)
    assert taken[0] == 0 and sum(taken) == battery.CAPACITY
    assert profit == pytest.approx(-10.0 * battery.CAPACITY)


def test_greedy_lands_near_the_published_076_on_the_offline_eval_days():
    eval_days = synthetic_days(200, seed=0, first=2000)
    scores = gridsim.baseline_scores(eval_days)
    assert scores["idle"] == pytest.approx(0.2)
    assert scores["optimum"] == pytest.approx(1.0)
    assert 0.72 <= scores["greedy"] <= 0.80


def test_prices_look_like_day_ahead_prices():
    days = synthetic_days(400, seed=1)
    mean_by_hour = [sum(d["prices"][h] for d in days) / len(days) for h in range(24)]
    assert min(range(24), key=mean_by_hour.__getitem__) in range(2, 7) or min(mean_by_hour[11:16]) < mean_by_hour[4]
    assert max(range(24), key=mean_by_hour.__getitem__) in range(17, 22)
    assert any(p < 0 for d in days for p in d["prices"])
    assert any(max(d["prices"]) > 5 * sorted(d["prices"])[12] for d in days)


def test_generator_writes_a_bundle_agent_env_parses(tmp_path):
    from agent_env.bundle import parse_bundle

    root = gridsim.write_bundle(tmp_path / "gs", train=5, eval=3, seed=2)
    parsed = parse_bundle(root)
    kinds = {}
    for entry in parsed.entries:
        kinds.setdefault(entry.kind.value, []).append(entry.name)
    assert len(kinds["tasks"]) == 8 and sorted(kinds["evals"]) == ["eval", "train"]
    assert (root / "envs/gridsim/battery.py").read_bytes() == open(battery.__file__, "rb").read()
    assert [d["prices"] for d in gridsim.read_days(root, "eval")] == [
        d["prices"] for d in synthetic_days(3, seed=2, first=5)]
    table = bundles.describe(root)
    assert set(table["splits"]) == {"train", "eval"} and (table["envs"] == "gridsim").all()
    with pytest.raises(FileExistsError, match="overwrite"):
        gridsim.write_bundle(root, train=1, eval=1)


def test_grader_is_no_tool_of_the_agent():
    server = (gridsim.generate.HERE / "env" / "server.py").read_text()
    assert "def grade" in server and '@tool(name="grade")' not in server
    steps = gridsim.generate.task_steps("day-x", "2024-01-01")
    assert [s["type"] for s in steps] == ["deploy_env", "load_artifact", "deploy_agent", "prompt_agent",
                                          "env_outcome_verifier"]
    json.dumps(steps)


def test_bundles_txt_names_the_real_and_the_tiny_bundle(tmp_path):
    known = bundles.known_bundles()
    assert known["gridsim-v1"].source == "hf-dataset:earakely-scale/GridSimEnv-AgentEnv"
    assert known["gridsim-v1"].what == "bundles/gridsim-v1"
    path = bundles.get_bundle("gridsim-tiny", tmp_path)
    assert len(list((path / "tasks").glob("*.json"))) == 24
    with pytest.raises(KeyError, match="gridsim-tiny"):
        bundles.get_bundle("no-such-bundle", tmp_path)
