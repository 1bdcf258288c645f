"""Preflight: the checks to pass before any GPU work starts, one row each, with the fix for each problem.

GPU and free memory against the preset, the trainer against the preset and vLLM, installed versions against
``requirements-gpu.txt``, unsloth imported before trl, the warm start notebook 02 saves, the env server reachable and
serving the split, the tools' schemas, thinking against the completion budget, the server's session limit against what
the trainer opens at once, and HF and Modal credentials::

    from agentenv_nb.notebook.preflight import preflight
    preflight("24gb", env=env, split="train", trainer_args=config, model="unsloth/Qwen3-4B", sandbox="modal",
              trainer="async")
    preflight("cpu-tiny", run_dir="runs/desk")   # with a row for the warm start in runs/desk/sft/merged

In a notebook the table is displayed; elsewhere each problem is printed on one line. ``strict=True`` raises
PreflightError when any check fails. A session limit below what the trainer opens at once, which would end rollouts
with CAPACITY_REACHED mid-training, is also warned about (``CapacityWarning``), where no one reads the table.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pandas as pd

from agentenv_nb import settings
from agentenv_nb.client.agentenv import describe_server
from agentenv_nb.envs.choice import MODAL
from agentenv_nb.envs.modal_credentials import MODAL_HOW_TO, find_modal_credentials
from agentenv_nb.host.plan import plan_for, plan_here, preset_for, runs_on_driver
from agentenv_nb.host.probe import Host, installed, version_text
from agentenv_nb.stack import vllm_load_problem
from agentenv_nb.train import earlier_steps
from agentenv_nb.train.export import hub_problem
from agentenv_nb.train.grpo.launch import ASYNC_EVALS, async_problem, processes_launched
from agentenv_nb.train.presets import PRESETS, Preset, gpu_need_gb, named, training_precision
from agentenv_nb.train.tracking import report_to_problem

COLUMNS = ["check", "status", "detail", "fix"]
THINKING_BUDGET = 6144  # the recipe page: Qwen3-4B's thinking on a GridSim day ran past this before any tool call
CPU_PINS = ("trl", "transformers", "unsloth")  # what the CPU path (stock TRL after unsloth's patch) depends on
TRAINER_STACK = {"torch", "unsloth", "unsloth-zoo", "trl", "transformers", "vllm", "vllm-bnb-plugin", "bitsandbytes",
                 "peft", "agentenv-framework"}  # a different version here fails; elsewhere it warns
RESTART = "then restart the runtime (Colab: Runtime -> Restart session)"
SET_UP = "run the set-up step (the notebook's first code cell, or python -m agentenv_nb.host)"


class PreflightError(RuntimeError):
    """A preflight check failed (``strict=True``); the message lists each failure with its fix."""


class CapacityWarning(UserWarning):
    """The env server's ``max_concurrent_envs`` is below the sessions the trainer opens at once."""


def _row(check: str, status: str, detail: str, fix: str = "") -> dict:
    return {"check": check, "status": status, "detail": detail, "fix": fix}


def check_gpu(preset: Preset, model: str | None = None) -> list[dict]:
    """The GPU's name and free memory against what ``preset`` needs for ``model`` (``presets.gpu_need_gb``: in the
    precision of vLLM's weights the model will load in), before this process holds any of it: once the model is
    loaded, what it holds; no GPU fails a GPU preset."""
    import torch

    try:
        need = gpu_need_gb(preset, model)
    except OSError:  # no model there to size yet (the warm start's row says why): the most the preset may need
        need = gpu_need_gb(preset)
    name = preset.name
    if not torch.cuda.is_available():
        if not need:
            return [_row("gpu", "ok", f"no GPU; the {name} preset runs on the CPU")]
        return [_row("gpu", "fail", f"no CUDA GPU is visible; the {name} preset needs about {need:.0f} GB free",
                     "Colab: Runtime -> Change runtime type -> a GPU (an L4 for '24gb'); elsewhere a machine with an "
                     "NVIDIA GPU; or preset='cpu-tiny' to run the tiny model on the CPU")]
    free, total = (value / 2**30 for value in torch.cuda.mem_get_info(0))
    card = f"{torch.cuda.get_device_name(0)}: {free:.1f} of {total:.1f} GB free"
    if held := torch.cuda.memory_reserved(0) / 2**30:  # what the model loaded here holds isn't free, nor needed again
        return [_row("gpu", "ok", f"{card}, this process holding {held:.1f} GB (the model): free memory counts "
                                  "before the model loads")]
    seen = f"{card}; the {name} preset needs {need:.0f}"
    if free >= need:
        return [_row("gpu", "ok", seen)]
    fix = ("restart the runtime to free what earlier cells hold, or stop other processes on the GPU (nvidia-smi)"
           if total >= need else f"a GPU with at least {need:.0f} GB, or a smaller preset ('24gb' needs "
                                 f"{gpu_need_gb(PRESETS['24gb']):.0f} GB)")
    if (quantized := gpu_need_gb(preset, weights="4bit")) < need:
        fix += f"; or 4-bit weights for vLLM, which need {quantized:.0f} GB (AGENTENV_NB_VLLM_WEIGHTS=4bit)"
    return [_row("gpu", "fail", seen, fix)]


def check_trainer(trainer: str, preset: Preset) -> list[dict]:
    """The trainer notebook 03 picks (``presets.TRAINERS``) against the preset and this machine: the async trainer needs
    vLLM and one process (``launch.async_problem``), and has no eval points (said here)."""
    from agentenv_nb.train.presets import TRAINERS

    if trainer not in TRAINERS:
        return [_row("trainer", "fail", f"unknown trainer {trainer!r}", f"TRAINER= one of {', '.join(TRAINERS)}")]
    if trainer != "async":
        return [_row("trainer", "ok", "TRL's GRPOTrainer (Unsloth's), evaluating every eval_steps")]
    if problem := async_problem(preset, processes_launched()):
        what, fix = problem.rsplit(": ", 1)
        return [_row("trainer", "fail", what, fix)]
    return [_row("trainer", "ok", f"Unsloth's AsyncGRPOTrainer on the model's own vLLM; {ASYNC_EVALS}")]


def _plan(host: Host | None):
    """The plan for ``host``, or this machine's (AGENTENV_NB_STACK heeded)."""
    return plan_for(host) if host is not None else plan_here()


def check_host(preset: Preset, host: Host | None = None) -> list[dict]:
    """This host against what runs on it (``host.plan``): its decision in one row; the installed torch against the
    driver; the precision against the card; the card against the preset."""
    plan = _plan(host)
    host = plan.host
    rows = [_row("host", "ok" if plan.stack else "fail", plan.line().removeprefix("agentenv_nb: "), plan.fix)]
    if host.gpus and host.torch and not runs_on_driver(host.torch_cuda, host.driver_cuda):
        rows.append(_row("driver", "fail", f"torch {host.torch} is built for CUDA {version_text(host.torch_cuda)}; "
                         f"this driver ({host.driver}) runs CUDA {version_text(host.driver_cuda)} at most, so torch "
                         "sees no GPU", f"{SET_UP}: it installs the '{plan.stack.name}' set here" if plan.stack else
                         plan.fix))
    if preset.on_cpu or host.gpu is None:
        return rows
    precision, card = training_precision(preset, host), host.gpu
    if precision == "bf16" and not card.bf16:
        rows.append(_row("precision", "fail", f"bf16 asked for, and {card.name} (compute capability "
                         f"{version_text(card.capability)}) has none: Unsloth loads the model in float16 there and its "
                         "trainers refuse bf16", "AGENTENV_NB_PRECISION=fp16, or unset it: fp16 is this card's"))
    else:
        rows.append(_row("precision", "ok", f"trains in {precision} on {card.name}"))
    if card.memory_gb < preset.gpu_gb * 0.9:
        rows.append(_row("card", "fail", f"the '{preset.name}' preset is made for a {preset.gpu_gb:.0f} GB card; "
                         f"{card.name} has {card.memory_gb:.0f} GB", f"PRESET='{preset_for(host)}' (or 'auto', the "
                                                                     "preset that fits this card)"))
    return rows


def check_vllm(preset: Preset) -> list[dict]:
    """A vLLM that is installed but doesn't load beside this torch (built for another CUDA or torch), where the preset
    would generate on it: generation falls back to transformers' ``generate``."""
    if not preset.vllm or importlib.util.find_spec("vllm") is None:
        return []
    if problem := vllm_load_problem():
        return [_row("vllm", "warn", f"{problem}; rollouts generate on transformers' generate instead, slower",
                     f"{SET_UP}: it installs the vLLM build this host runs")]
    return [_row("vllm", "ok", "vllm's compiled extensions load beside this torch")]


def check_versions(preset: Preset, host: Host | None = None) -> list[dict]:
    """Installed versions against the pins of the set this host runs (``host.stacks``); on the CPU only the trl,
    transformers and unsloth pins matter, the rest being the GPU stack's. The fix is the set-up step, never a bare
    pip line: the pinned torch of another set could be one this driver can't run."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    plan = _plan(host)
    if plan.stack is None:
        return []  # the host row says what to do
    cpu = preset.on_cpu
    rows, matched = [], 0
    for text in plan.stack.requirements(plan.keep_torch):
        pin = Requirement(text)
        name = canonicalize_name(pin.name)
        if cpu and name not in CPU_PINS:
            continue
        version = installed(pin.name)
        if version is not None and pin.specifier.contains(version, prereleases=True):
            matched += 1
            continue
        status = "fail" if name in TRAINER_STACK else "warn"
        seen = f"{pin.name} {version}, " if version else f"{pin.name} is not installed; "
        rows.append(_row(f"version {pin.name}", status, f"{seen}the '{plan.stack.name}' set pins {pin}",
                         f"{SET_UP}, {RESTART}"))
    scope = " (on the CPU only trl, transformers and unsloth matter; the other pins are the GPU stack's)" if cpu else ""
    return [_row("versions", "ok" if not rows else "warn", f"{matched} pins of the '{plan.stack.name}' set "
                 f"match{scope}"), *rows]


def _first_import(prefix: str) -> int | None:
    """Where ``prefix`` or a submodule of it first appears in ``sys.modules``, which keeps import order."""
    return next((i for i, name in enumerate(sys.modules) if name == prefix or name.startswith(prefix + ".")), None)


def check_import_order() -> list[dict]:
    """``unsloth`` imported before ``trl``, so it can rewrite TRL's trainers (GPU) or patch their CPU path."""
    trl, unsloth = _first_import("trl"), _first_import("unsloth")
    if trl is not None and (unsloth is None or trl < unsloth):
        return [_row("import order", "fail", "trl was imported before unsloth, so Unsloth can't rewrite TRL's "
                     "trainers (GPU) or patch trl 1.15's fused LM head (CPU)",
                     "restart the runtime and run this cell first; call agentenv_nb.stack.import_unsloth() (or "
                     "`import unsloth`) before anything that imports trl")]
    if unsloth is None:
        return [_row("import order", "ok", "neither is imported yet; presets.grpo_config imports unsloth first")]
    return [_row("import order", "ok", "unsloth was imported before trl")]


def server_url(env) -> str:
    """The server URL of an AgentEnv, or ``env`` itself when it is a URL."""
    return (env if isinstance(env, str) else env.url).rstrip("/")


def check_server(env, split: str, timeout: float = 10.0) -> list[dict]:
    """The env server answers and serves ``split`` with at least one task (OpenEnv's Task API)."""
    url = server_url(env)
    port = urlsplit(url).port or settings.get("port")  # the URL's: the server to start is the one it asks
    start = (f"start it on the env host: python -m agentenv_nb.envs.serve BUNDLE --host 0.0.0.0 --port {port} "
             "--max-concurrent-envs 64 (docs/env-host.md), or use AgentEnv.local(BUNDLE)")
    token = env.token if hasattr(env, "token") else settings.get("token")
    try:
        with httpx.Client(timeout=timeout, trust_env=False,
                          headers={"Authorization": f"Bearer {token}"} if token else None) as http:
            name, splits = describe_server(http, url)
            if split not in splits:
                return [_row("env server", "fail", f"{url} serves {name} with splits {', '.join(splits)}; no {split!r}",
                             f"use one of them (split=...), or serve a bundle with an eval named {split!r}")]
            count = http.post(f"{url}/{name}/num_tasks", json={"split": split}).raise_for_status().json()["num_tasks"]
    except PermissionError as error:
        return [_row("env server", "fail", str(error), "pass the token the server printed: AgentEnv(url, token=...) "
                     "or AGENTENV_NB_TOKEN")]
    except (ConnectionError, httpx.HTTPError, ValueError, KeyError) as error:
        return [_row("env server", "fail", f"{type(error).__name__}: {error}", start)]
    if not count:
        return [_row("env server", "fail", f"{url} serves split {split!r} with no task", "serve a bundle whose "
                     f"eval {split!r} lists tasks; the server's log says which tasks it left out and why")]
    return [_row("env server", "ok", f"{url} serves {name}, split {split!r}: {count} tasks")]


def check_tools(env, tokenizer=None) -> list[dict]:
    """The tools' schemas as TRL will read them, and with a tokenizer its chat template's round trip (``checks``).
    Learning the tools plays the split's first task on the server, so a server that can't deploy its envs fails here
    too."""
    from agentenv_nb.client import checks
    from agentenv_nb.stack import import_unsloth

    try:
        problems = checks.tool_problems(env.factories)
    except Exception as error:  # whatever stopped the server playing a task: a deploy, a timeout, a lost session
        return [_row("tool schemas", "fail", f"the server couldn't play a task to list its tools: {error}",
                     "read the env server's log; on the env host, check its sandbox (docs/env-host.md)")]
    if tokenizer is not None and (_first_import("trl") is None or _first_import("unsloth") is not None):
        import_unsloth()  # the template check imports trl, which must come after unsloth
        problems += checks.template_problems(tokenizer)
    if not problems:
        return [_row("tool schemas", "ok", f"every tool of {', '.join(env.factories)} has a schema TRL reads"
                     + (", and a conversation with tool calls makes the round trip through the chat template, SFT's "
                        "loss mask and TRL's parser" if tokenizer is not None else ""))]
    return [_row("tool schemas", "fail", *problem.split("; ", 1)) for problem in problems]  # what; its fix


def check_thinking(trainer_args, tokenizer=None) -> list[dict]:
    """Thinking on (``chat_template_kwargs.enable_thinking`` not False) with a completion budget the recipe page saw
    run out before the first tool call."""
    if tokenizer is not None and "enable_thinking" not in (getattr(tokenizer, "chat_template", None) or ""):
        return [_row("thinking", "ok", "the chat template has no thinking switch")]
    thinking = (getattr(trainer_args, "chat_template_kwargs", None) or {}).get("enable_thinking", True) is not False
    budget = trainer_args.max_completion_length
    if thinking and budget < THINKING_BUDGET:
        return [_row("thinking", "warn", f"thinking is on with max_completion_length={budget}; Qwen3-4B thought past "
                     f"{THINKING_BUDGET} tokens on GridSim before any tool call, so every rollout scored 0",
                     "chat_template_kwargs={'enable_thinking': False} (the presets' setting), or a "
                     f"max_completion_length well over {THINKING_BUDGET}")]
    return [_row("thinking", "ok", f"thinking {'on' if thinking else 'off'}, max_completion_length={budget}")]


def capacity_warning(trainer_args, max_concurrent_envs: int | None, environments: int = 1) -> str | None:
    """Warn (CapacityWarning) when the server can't hold the trainer's sessions; return the warning or None."""
    from agentenv_nb.train.sessions import capacity_problem

    problem = None if max_concurrent_envs is None else capacity_problem(trainer_args, max_concurrent_envs, environments)
    if problem:
        warnings.warn(problem, CapacityWarning, stacklevel=3)
    return problem


def check_capacity(trainer_args, max_concurrent_envs: int | None, environments: int = 1) -> list[dict]:
    """The server's session limit against what the trainer opens at once; a limit too low is warned about too."""
    if max_concurrent_envs is None:
        return [_row("sessions", "warn", "the env server's max_concurrent_envs is unknown here (OpenEnv doesn't "
                     "publish it), so CAPACITY_REACHED mid-training can't be ruled out",
                     "pass max_concurrent_envs= what the server was started with, to AgentEnv(url, ...) or here")]
    problem = capacity_warning(trainer_args, max_concurrent_envs, environments)
    if problem:
        what, fix = problem.rsplit("; ", 1)
        return [_row("sessions", "fail", what, fix)]
    return [_row("sessions", "ok", f"max_concurrent_envs={max_concurrent_envs} holds the trainer's sessions")]


def check_warm_start(run_dir: str | Path, warm_start: str = "") -> list[dict]:
    """The model GRPO starts from: the one notebook 02 saved in RUN_DIR/sft/merged, or ``warm_start``'s."""
    if problem := earlier_steps.warm_start_problem(run_dir, warm_start):
        what, fix = problem.split(": ", 1)
        return [_row("warm start", "fail", what, fix)]
    return [_row("warm start", "ok", earlier_steps.warm_start(run_dir, warm_start))]


def check_hf(needs_hf: bool | None, model: str | None) -> list[dict]:
    """An HF token (HF_TOKEN, a cached login or Colab's secret HF_TOKEN) where a model or bundle comes from the Hub."""
    from huggingface_hub import get_token

    if not (needs_hf if needs_hf is not None else earlier_steps.looks_like_hub_id(model)):
        return []
    if get_token():
        return [_row("hf token", "ok", "a Hugging Face token is set")]
    return [_row("hf token", "warn", "no Hugging Face token, and the model or bundle comes from the Hub: a gated or "
                 "private repo fails, a public one downloads rate-limited",
                 "huggingface_hub.login(), or set HF_TOKEN (Colab: add the secret HF_TOKEN with notebook access)")]


def check_modal(sandbox) -> list[dict]:
    """Modal credentials, where the envs deploy on Modal."""
    if getattr(sandbox, "name", sandbox) != MODAL:
        return []
    found = find_modal_credentials()
    if found:
        return [_row("modal", "ok", f"Modal credentials from {found.source}")]
    return [_row("modal", "fail", "no Modal credentials, and the envs deploy on Modal", MODAL_HOW_TO)]


def check_tracking(report_to: str | None) -> list[dict]:
    """The ``report_to`` integration's package, where one is asked for."""
    if report_to in (None, "none"):
        return []
    if problem := report_to_problem(report_to):
        return [_row("tracking", "fail", problem, "pip install it and restart the kernel, or set REPORT_TO='none'")]
    return [_row("tracking", "ok", f"metrics and scores also go to {report_to}")]


def check_push(repo: str | None) -> list[dict]:
    """A Hub repo id and a token to push the trained model with, where a push is asked for."""
    if not repo:
        return []
    if problem := hub_problem(repo):
        return [_row("push to hub", "fail", problem, "fix PUSH_TO_HUB or set HF_TOKEN, then run this cell again")]
    return [_row("push to hub", "ok", f"the trained model goes to {repo} (private)")]


def preflight(preset: Preset | str = "auto", env=None, split: str = "train", tokenizer=None, trainer_args=None,
              needs_hf: bool | None = None, sandbox=None, model: str | None = None, report_to: str | None = None,
              push_to_hub: str | None = None, trainer: str | None = None, run_dir: str | Path | None = None,
              warm_start: str = "", max_concurrent_envs: int | None = None, host: Host | None = None,
              strict: bool = False, show: bool = True) -> pd.DataFrame:
    """Run every check that applies and return the table (check, status ok/warn/fail, detail, fix).

    ``env`` is an AgentEnv or a server URL; ``trainer_args`` a GRPOConfig; ``sandbox`` a name or a Choice;
    ``report_to`` a tracking integration (``train.tracking``); ``push_to_hub`` a Hub repo (``train.export``);
    ``trainer`` notebook 03's TRAINER ("grpo" or "async"); ``run_dir`` notebook 03's RUN_DIR, whose warm start
    (notebook 02's, or ``warm_start``) is checked, and is the model unless ``model`` is given;
    ``max_concurrent_envs`` defaults to the env's own (``AgentEnv.max_concurrent_envs``: known for ``local``);
    ``host`` to this machine as ``host.probe`` reads it.
    ``show`` displays the table in a notebook, elsewhere prints a line per problem; ``strict`` raises PreflightError
    on any fail.
    """
    preset = named(preset)  # resolved once, for every check: an unknown name is refused before any runs
    if run_dir is not None:
        model = model or earlier_steps.warm_start(run_dir, warm_start)
    rows = check_host(preset, host) + check_gpu(preset, model) + check_vllm(preset) + check_versions(preset, host)
    rows, environments = rows + check_import_order(), 1
    rows += check_warm_start(run_dir, warm_start) if run_dir is not None else []
    rows += check_trainer(trainer, preset) if trainer is not None else []
    if env is not None:
        rows += check_server(env, split)
        if not isinstance(env, str):
            rows += (tools := check_tools(env, tokenizer))
            # TRL keeps sessions per class: one unless tasks differ in tools; a failed probe isn't played again.
            if env.toolsets == "each" and all(row["status"] == "ok" for row in tools):
                environments = len(env.factories)
    if trainer_args is not None:
        rows += check_thinking(trainer_args, tokenizer)
        limit = max_concurrent_envs if max_concurrent_envs is not None else getattr(env, "max_concurrent_envs", None)
        rows += check_capacity(trainer_args, limit, environments)
    rows += check_hf(needs_hf, model) + check_modal(sandbox) + check_tracking(report_to) + check_push(push_to_hub)
    table = pd.DataFrame(rows, columns=COLUMNS)
    if show:
        _show(table)
    failed = table[table.status == "fail"]
    if strict and len(failed):
        raise PreflightError("preflight failed:\n" + "\n".join(_line(row) for row in failed.itertuples()))
    return table


def _line(row) -> str:
    return f"{row.status.upper()} {row.check}: {row.detail}" + (f" -> fix: {row.fix}" if row.fix else "")


def _show(table: pd.DataFrame) -> None:
    """Display the table in a notebook; elsewhere print one line per problem and a count."""
    from transformers.utils.import_utils import is_in_notebook

    if is_in_notebook():
        from IPython.display import display

        display(table.style.apply(lambda row: [f"background-color: {_COLOURS[row.status]}"] * len(row), axis=1))
        return
    problems = table[table.status != "ok"]
    for row in problems.itertuples():
        print(f"preflight: {_line(row)}")
    print(f"preflight: {len(table) - len(problems)} of {len(table)} checks ok")


_COLOURS = {"ok": "#e6f4ea", "warn": "#fef7e0", "fail": "#fce8e6"}
