"""After GRPO: a finished run, run again as notebook 03 runs it, exports the trained model (its adapter is the last
checkpoint's), the merged 16-bit model reloads and answers as the trained one does, and it plays a GridSim eval day
through the env; a push to the Hub it can't make is refused before anything is saved."""

import pytest
import torch
from safetensors.torch import load_file

from agentenv_nb.notebook.transcript import transcript, try_it
from agentenv_nb.train import export
from agentenv_nb.train.naming import COMMAND


def test_a_push_it_cannot_make_is_refused_in_one_line_before_anything_is_saved(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached login either
    assert export.hub_problem("") is None
    assert export.hub_problem("not a repo").startswith("PUSH_TO_HUB='not a repo' is not a Hub repo id: give owner/name")
    assert export.hub_problem("nested/too/deep").startswith("PUSH_TO_HUB='nested/too/deep' is not a Hub repo id")
    assert "needs a Hugging Face token with write access: set HF_TOKEN" in export.hub_problem("you/model")
    with pytest.raises(ValueError, match="needs a Hugging Face token"):
        export.export_model(None, None, tmp_path / "trained", push_to_hub="you/model")
    assert not (tmp_path / "trained").exists()
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    assert export.hub_problem("you/model") is None


def test_without_a_built_llama_cpp_the_gguf_is_skipped_and_says_why():
    problem = export.llama_cpp_problem()  # imports unsloth first, as unsloth_zoo needs
    from unsloth_zoo.llama_cpp import LLAMA_CPP_DEFAULT_DIR

    assert problem == export.NO_LLAMA_CPP.format(folder=LLAMA_CPP_DEFAULT_DIR, build="set BUILD_LLAMA_CPP=True")
    assert "pass --build-llama-cpp" in export.llama_cpp_problem(COMMAND)


def length_reward(completions, **kwargs) -> list[float]:
    """A spread within every group, so that the step moves the LoRA weights (the random model scores 0 on GridSim)."""
    return [float(len(str(completion)) % 7) for completion in completions]


@pytest.mark.slow
def test_a_finished_run_exports_the_trained_model_which_reloads_and_plays_a_day(tiny_model, tmp_path, capsys):
    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks import gridsim
    from agentenv_nb.train import presets
    from agentenv_nb.train.model import loading
    from agentenv_nb.train.fit import fit
    from agentenv_nb.train.grpo.trainer import GRPOTrainer

    bundle = gridsim.write_bundle(tmp_path / "gridsim-tiny", train=2, eval=1)
    out = str(tmp_path / "grpo")
    with AgentEnv.local(bundle, sandbox="process", max_concurrent_envs=24) as env:  # two trainers and play
        def trainer():  # notebook 03's cells, on the tiny preset
            model, tokenizer = loading.load_model(tiny_model, "cpu-tiny")
            config = presets.grpo_config("cpu-tiny", output_dir=out, max_steps=1, save_steps=1, resume=True,
                                         eval_strategy="no", eval_on_start=False, max_completion_length=64)
            return GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset,
                               environment_factory=env.factory, reward_funcs=[*env.reward_funcs, length_reward],
                               callbacks=[env.metrics])

        fit(trainer())
        again = trainer()  # Restart and Run All on the finished run
        fit(again)
        assert "the run is finished" in capsys.readouterr().out
        saved = export.export_model(again.model, again.processing_class, tmp_path / "trained")
        said = capsys.readouterr().out
        assert "GGUF skipped: Unsloth's exporter needs a built llama.cpp" in said and saved["gguf"] is None
        assert "set BUILD_LLAMA_CPP=True" in said  # in the notebook's words; the command's say --build-llama-cpp
        assert f"merged: {saved['merged']}" in said

        trained = load_file(f"{out}/checkpoint-1/adapter_model.safetensors")
        exported = load_file(f"{saved['adapter']}/adapter_model.safetensors")
        assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
        assert any(v.abs().sum() > 0 for k, v in trained.items() if "lora_B" in k)  # a trained adapter, not a fresh one

        reloaded, tokenizer = export.reload(saved["merged"], "cpu-tiny")
        assert not hasattr(reloaded, "peft_config")  # the merged model itself, no adapter on top
        ids = tokenizer("Charge when power is cheap.", return_tensors="pt")
        with torch.no_grad():
            again.model.eval()
            torch.testing.assert_close(reloaded(**ids).logits, again.model(**ids).logits, rtol=0.02, atol=0.02)
        day = try_it(reloaded, tokenizer, env, day=0, prompt="Plan the battery: charge cheap, sell dear.",
                     max_new_tokens=64)
        assert day["reward"] is not None and day["messages"][-1]["role"] == "assistant"  # scored by the verifier
        assert [m["content"] for m in day["messages"] if m["role"] == "user"] == [
            "Plan the battery: charge cheap, sell dear."]
        with pytest.raises(ValueError, match=r"day 1: the 'eval' split has 1 tasks, 0 to 0"):
            try_it(reloaded, tokenizer, env, day=1)
    shown = transcript(day).to_html()
    assert "<caption>gridsim-tiny/eval-0000: reward " in shown and str(tmp_path) not in shown


def test_a_transcript_reads_as_a_conversation():
    call = {"type": "function", "function": {"name": "submit_schedule", "arguments": {"schedule": [0, 1, -1]}}}
    rollout = {"task_id": "@local/root/runs/bundles/gridsim-v1/eval-0007", "reward": None, "tools": [],
               "tool_calls": 1, "tool_failures": 0, "messages": [
                   {"role": "user", "content": "Plan the day."}, {"role": "assistant", "content": "", "tool_calls": [call]},
                   {"role": "tool", "name": "submit_schedule", "content": "ok"},
                   {"role": "assistant", "content": '<tool_call>\n{"name": "end_turn"</tool_call>'}]}
    table = transcript(rollout)
    assert table.data["who"].tolist() == ["user", "assistant", "tool: submit_schedule", "assistant"]
    assert table.data["message"][1] == "submit_schedule(schedule=[0, 1, -1])"
    shown = table.to_html()
    assert "<caption>gridsim-v1/eval-0007: not scored" in shown and "&lt;tool_call&gt;" in shown
