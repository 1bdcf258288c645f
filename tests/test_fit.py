"""``fit`` on a resumed or finished GRPO run: the trainer's model holds the checkpoint's weights, and its optimizer
and scheduler the checkpoint's state, compared tensor by tensor with the files transformers saved."""

import pytest
import torch
from safetensors.torch import load_file

from .conftest import grpo

pytestmark = pytest.mark.slow


def length_reward(completions, **kwargs) -> list[float]:
    """A reward with a spread within every group, so that each step moves the LoRA weights."""
    return [float(len(str(completion)) % 7) for completion in completions]


ROWS = [{"prompt": [{"role": "user", "content": f"Say {word}."}]} for word in ("yes", "no", "maybe", "later")]


def trainer(tiny_model, out, steps, **config):
    from datasets import Dataset

    return grpo(tiny_model, out, dataset=Dataset.from_list(ROWS), factory=None, steps=steps,
                reward_funcs=[length_reward], save_strategy="steps", save_steps=1, **config)


def adapter(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(model).items()}


def assert_holds(model, optimizer, checkpoint):
    saved = load_file(checkpoint / "adapter_model.safetensors")
    held = adapter(model)
    assert held.keys() == saved.keys() and all(torch.equal(held[k], saved[k]) for k in saved), checkpoint
    assert any(k for k in saved if "lora_B" in k and saved[k].abs().sum() > 0)  # trained: LoRA B starts at zero
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    held_state = optimizer.state_dict()["state"]
    assert held_state.keys() == state.keys() and len(state) > 0
    assert all(torch.equal(held_state[i][k], state[i][k]) for i in state for k in state[i])


def test_a_finished_or_resumed_run_holds_its_checkpoints_weights(tiny_model, tmp_path, capsys):
    from transformers import TrainerCallback

    from agentenv_nb.train.fit import fit

    out = tmp_path / "grpo"
    fit(trainer(tiny_model, out, 2))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]

    finished = trainer(tiny_model, out, 2, resume_from_checkpoint=str(out / "checkpoint-2"))
    assert all(v.abs().sum() == 0 for k, v in adapter(finished.model).items() if "lora_B" in k)  # a fresh adapter
    fit(finished)
    assert "the run is finished, nothing to train; its weights are loaded" in capsys.readouterr().out
    assert finished.state.global_step == 2 and finished.lr_scheduler.last_epoch == 2
    assert_holds(finished.model, finished.optimizer, out / "checkpoint-2")

    class AtStart(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            assert_holds(model, optimizer, out / "checkpoint-1")
            self.checked = True

    at_start = AtStart()
    resumed = trainer(tiny_model, tmp_path / "grpo", 2, resume_from_checkpoint=str(out / "checkpoint-1"),
                      callbacks=[at_start])
    fit(resumed)
    assert at_start.checked and resumed.state.global_step == 2
