"""docs/own-bundle.md's example runs as written: its ``make_desk.py`` writes a bundle agent_env parses, of two
toolsets and two-turn tasks with a verifier a turn, that no task adapter claims, and its demonstrations. The four
notebooks run on it in the browser test (``tests/test_browser.py``)."""

import pytest

from agentenv_nb.notebook import views
from agentenv_nb.tasks import bundles
from agentenv_nb.tasks.adapters import adapter_for

from .desk import write_desk


def test_the_page_writes_a_bundle_with_two_toolsets_and_two_verifiers(tmp_path):
    bundle, demos = write_desk(tmp_path)
    tasks = bundles.describe(bundle)
    assert set(tasks["envs"]) == {"dictionary", "calculator"}
    assert set(tasks["verifiers"]) == {"answer, follow_up"}
    assert views.splits(bundle)["tasks"].to_dict() == {"train": 6, "eval": 2, "all": 8}
    assert adapter_for(bundle) is None  # GridSim's adapter doesn't claim it
    assert bundles.toolset_count(bundle, "each") == 2 and bundles.toolset_count(bundle, "first") == 1
    assert len(demos.read_text().splitlines()) == 6


@pytest.mark.slow
def test_without_an_expert_or_demonstrations_the_warm_start_is_self_distillation_and_says_so(tmp_path, capsys):
    from agentenv_nb import AgentEnv
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.warm_start import sources

    bundle, demos = write_desk(tmp_path)
    # 16 sessions: play keeps up to a batch of 8 environments a toolset, as TRL pools them
    with AgentEnv.local(bundle, split="train", sandbox="process", max_concurrent_envs=16, reward="min",
                        toolsets="each") as env:
        start = sources.choose(bundle, env)
        assert start.source == sources.SELF_DISTILLATION and not start.demonstrations
        assert "warm start from self-distillation: no task adapter with an expert" in capsys.readouterr().out
        model, tokenizer = loading.load_model("tiny", "cpu-tiny", "sft", models_dir=tmp_path / "models")
        import torch

        torch.manual_seed(0)  # the samples below, the same on every run
        # a random model writes no end_turn, so every turn ends empty and scores 0: nothing of its own to learn from
        with pytest.raises(ValueError, match="none of the model's 12 rollouts .* scored above 0.*give DEMOS"):
            start.sft_dataset(model, tokenizer, env, "cpu-tiny", max_new_tokens=16)
        given = sources.choose(bundle, env, demos=demos)
        assert given.source == sources.DEMONSTRATIONS and len(given.sft_dataset(model, tokenizer, env, "cpu-tiny")) == 6
