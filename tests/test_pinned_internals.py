"""The pinned libraries' internals the kit builds on, read from their installed source. A change there fails here,
naming the kit module to read again, before it fails in a run:

- trl 1.15.0, ``GRPOTrainer._tool_call_loop`` and ``_generate_and_score_completions``: ``train.grpo.trainer``
- Unsloth and unsloth_zoo 2026.10.9, ``load_lora`` and ``fast_generate`` on a fast_inference model:
  ``train.rollout``
- Unsloth and unsloth_zoo 2026.10.9, each process's model and vLLM engine on GPU ``LOCAL_RANK``:
  ``train.presets.vllm_sizing`` and ``train.grpo.launch``
- Unsloth 2026.10.9 with vLLM 0.29.0, the fp8 gate and vLLM's online fp8: ``train.presets.vllm_sizing`` and
  ``train.presets``
- httpx 0.28.1, the transports' first parameters: ``envs.tls``
- trl 1.15.0, Unsloth and unsloth_zoo 2026.10.9, where a GRPO step's parts run: bench/gpu_grpo.py's ``train``
- Unsloth and unsloth_zoo 2026.10.9, the module names of its compiled trainers: ``library_log``

Read as text, importing nothing: importing ``unsloth.models`` puts Unsloth's trainers in TRL's place for the rest of
the process, unsloth_zoo refuses to import before unsloth, and vLLM, which they import, needs a GPU. What these
internals do is run where it can run: tests/test_launch.py, tests/test_vllm_weights.py, tests/gpu/.
"""

import ast
import hashlib
import importlib.util
import inspect
from pathlib import Path

import httpx

# GRPOTrainer's methods as read in trl 1.15.0: the loop the kit's trainer hands per-rollout tool dicts, and where TRL
# builds those dicts and resets the environments
TRL_METHODS = {"_tool_call_loop": "acc9b1db6fed3d92f75e9068effc4d2042af71a6807537b9c3ce243c130138b7",
               "_generate_and_score_completions": "1fa48922792dcd5c72da155cfe99db477771a7c61cde15519fe8c86d0cdc0b65"}
VLLM_SIZING, LAUNCH = "agentenv_nb.train.presets.vllm_sizing", "agentenv_nb.train.grpo.launch"


def pinned_source(module: str, name: str = "") -> str:
    """The installed source of ``module`` (found from its top package, which is not imported), or of the definition
    ``name`` in it ("function" or "Class.method"), decorators included."""
    top, *rest = module.split(".")
    source = Path(importlib.util.find_spec(top).origin).parent.joinpath(*rest[:-1], rest[-1] + ".py").read_text()
    if not name:
        return source
    node = definition(source, name)
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    return "".join(source.splitlines(keepends=True)[first - 1:node.end_lineno])


def definition(source: str, name: str) -> ast.FunctionDef:
    scope = ast.parse(source)
    for part in name.split("."):
        [scope] = [node for node in scope.body if getattr(node, "name", None) == part
                   and isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    return scope


def assert_says(text: str, where: str, revisit: str, *needles: str) -> None:
    missing = [needle for needle in needles if needle not in text]
    assert not missing, f"{where} changed, it no longer has {missing}: revisit {revisit}, then this check"


def test_the_trl_methods_the_kit_trainer_builds_on_are_the_ones_read():
    for name, digest in TRL_METHODS.items():
        source = pinned_source("trl.trainer.grpo_trainer", f"GRPOTrainer.{name}")
        assert hashlib.sha256(source.encode()).hexdigest() == digest, (
            f"trl's GRPOTrainer.{name} changed: agentenv_nb.train.grpo.trainer relies on it calling each rollout's "
            "sync tools from self._sync_tool_dicts in order; read it again, then update TRL_METHODS")


def test_vllm_play_hands_vllm_the_lora_as_the_pinned_unsloth_grpo_does():
    """``rollout._on_vllm`` calls what Unsloth sets on a fast_inference PEFT model: ``fast_generate`` (the engine's
    ``generate``) and ``load_lora(folder, load_tensors=True)``, the live adapter's tensors as a LoRA request, as
    Unsloth's GRPOTrainer calls it before each generation."""
    rollout = "agentenv_nb.train.rollout"
    assert_says(pinned_source("unsloth_zoo.vllm_utils", "load_lora"), "unsloth_zoo's load_lora", rollout,
                "def load_lora(model, save_directory, load_tensors = False, lora_request_id = None):")
    assert_says(pinned_source("unsloth.models._utils"), "Unsloth's PEFT model", rollout,
                "model.load_lora = functools.partial(load_lora, model)",
                "model.fast_generate = model.model.fast_generate")
    assert_says(pinned_source("unsloth.models.rl"), "Unsloth's GRPOTrainer", rollout,
                "lora_request = self.model.load_lora('")
    assert_says(pinned_source("unsloth.models.llama"), "Unsloth's fast_inference load", rollout,
                "model.fast_generate = model.vllm_engine.generate")


def test_unsloth_puts_each_processs_model_and_vllm_engine_on_its_local_rank():
    """Under torchrun or accelerate launch, Unsloth sets the device to ``LOCAL_RANK`` as the model loads, and
    unsloth_zoo starts vLLM's ``external_launcher`` executor on that GPU with a seed a rank: the GPU the kit sizes
    (``vllm_sizing.this_gpu``). What those functions answer is run in tests/test_launch.py."""
    assert_says(pinned_source("unsloth.models.loader_utils", "prepare_device_map"), "Unsloth's prepare_device_map",
                VLLM_SIZING, "torch.cuda.set_device(local_rank)")
    assert_says(pinned_source("unsloth_zoo.vllm_utils", "_setup_vllm_external_launcher"),
                "unsloth_zoo's _setup_vllm_external_launcher", f"{VLLM_SIZING} and {LAUNCH}",
                'engine_args["distributed_executor_backend"] = "external_launcher"',
                "torch.cuda.set_device(local_index)", "dist.get_rank()")
    assert_says(pinned_source("unsloth_zoo.vllm_utils", "load_vllm"), "unsloth_zoo's load_vllm", LAUNCH,
                "_setup_vllm_external_launcher(engine_args, torchrun_info)")


def test_unsloth_gates_fp8_by_the_card_and_asks_vllm_0_29_for_its_online_fp8():
    """``vllm_weights="fp8"`` loads with ``load_in_fp8=True``: Unsloth checks the card as vLLM loads (its
    from_pretrained calls the gate with fast_inference; ``vllm_sizing.FP8_FROM`` is the gate's 9.0), then hands vLLM
    its own online fp8 (``quantization=``, the gate's mode passed on), not an offline torchao copy of the model, on a
    vLLM that quantizes as it loads (0.12 and later). What the gate answers is run in tests/test_vllm_weights.py."""
    revisit = f"{VLLM_SIZING} (FP8_FROM, choose_weights) and agentenv_nb.train.presets (vllm_weights)"
    assert_says(pinned_source("unsloth.models.llama", "FastLlamaModel.from_pretrained"),
                "Unsloth's FastLlamaModel.from_pretrained", revisit,
                "_get_fp8_mode_and_check_settings(\n                        load_in_fp8,\n                        "
                "fast_inference,")
    assert_says(pinned_source("unsloth_zoo.vllm_utils"), "unsloth_zoo's vllm_utils", revisit,
                'engine_args["quantization"] = native_fp8')
    load_vllm = definition(pinned_source("unsloth_zoo.vllm_utils"), "load_vllm")
    parameters = [argument.arg for argument in load_vllm.args.args + load_vllm.args.kwonlyargs]
    assert "fp8_mode" in parameters or "fp8_mode = fp8_mode" in pinned_source("unsloth_zoo.vllm_utils", "load_vllm"), (
        f"unsloth_zoo's load_vllm takes no fp8_mode: revisit {revisit}, then this check")
    assert_says(pinned_source("unsloth.models.loader_utils", "_fp8_needs_offline_quantize"),
                "Unsloth's _fp8_needs_offline_quantize", revisit, 'Version(vllm.__version__) < Version("0.12.0")')


def test_a_grpo_steps_parts_run_where_the_benchmark_times_them():
    """bench/gpu_grpo.py splits a step by wrapping, on the trainer: TRL's ``_prepare_inputs`` (a micro-batch's
    generation and scoring, the rest being the update; the masks of what it trains) and the log-prob pass, the
    ``_get_per_token_logps_and_entropies`` calls under no_grad (Unsloth's loss calls it with grad and
    ``compute_efficient``, doing no pass); on Unsloth's model, ``load_lora``, whose request's ``lora_tensors``, or the
    merged-weight rollout's state's 16-bit weights, it counts; and unsloth_zoo's ``merged_rollout``, looked up as a
    global, the fold and restore it times."""
    bench = "bench/gpu_grpo.py (train, synced_bytes, trained_tokens, scored_tokens)"
    trl = "trl.trainer.grpo_trainer"
    assert_says(pinned_source(trl, "GRPOTrainer._prepare_inputs"), "TRL's _prepare_inputs", bench,
                "generation_batch = self._generate_and_score_completions(generation_batch)")
    assert_says(pinned_source(trl, "GRPOTrainer._generate_and_score_completions"), "TRL's scoring", bench,
                "with torch.no_grad(), disable_gradient_checkpointing(",
                "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(\n"
                "                    self.model,\n                    prompt_completion_ids,\n"
                "                    attention_mask,",
                '"prompt_mask": prompt_mask,', '"completion_mask": completion_mask,')
    assert_says(pinned_source("unsloth.models.rl_replacements", "grpo_trainer_compute_loss"), "Unsloth's loss",
                bench, "model, input_ids, attention_mask, logits_to_keep, compute_efficient = True")
    assert_says(pinned_source("unsloth.models.rl"), "Unsloth's GRPOTrainer", bench,
                "lora_request = self.model.load_lora('")
    vllm_utils = "unsloth_zoo.vllm_utils"
    assert_says(pinned_source(vllm_utils, "load_lora"), "unsloth_zoo's load_lora", bench,
                "if state is not None: return _MergedLoRARequest(state, save_directory)")
    assert_says(pinned_source(vllm_utils, "_build_lora_request"), "unsloth_zoo's LoRA request", bench,
                "lora_tensors = state_dict")
    assert_says(pinned_source(vllm_utils, "_MergedRolloutState.__init__"), "unsloth_zoo's merged rollout", bench,
                "self.entries = entries   # (lora module, W the shared base weight, P its pristine copy on the host)")
    assert_says(pinned_source(vllm_utils, "_merged_rollout_call"), "unsloth_zoo's merged-rollout call", bench,
                "with merged_rollout(state): return call(rest_request)")
    assert_says(pinned_source(vllm_utils, "merged_rollout"), "unsloth_zoo's merged_rollout", bench,
                "@contextlib.contextmanager\ndef merged_rollout(state):")


def test_httpx_transports_still_take_verify_cert_trust_env_first():
    """``envs.tls`` passes these three on by position: a new httpx that moves them must fail here, not in a run."""
    for transport in (httpx.HTTPTransport, httpx.AsyncHTTPTransport):
        parameters = list(inspect.signature(transport.__init__).parameters)  # httpx's own, where envs.tls wrapped it
        assert parameters[:4] == ["self", "verify", "cert", "trust_env"], (
            f"httpx's {transport.__name__} takes {parameters}: revisit agentenv_nb.envs.tls, then this check")


def test_unsloths_compiled_trainers_are_modules_named_unsloth_and_trls_class():
    """Unsloth's rewrite of a TRL trainer and its config is a module named "Unsloth" and the trainer's name, which
    unsloth_zoo's compiler runs under that name: what it prints goes to the library log by that name
    (``library_log.COMPILED_BY_UNSLOTH``; run in tests/test_library_log.py)."""
    revisit = "agentenv_nb.library_log (COMPILED_BY_UNSLOTH)"
    assert_says(pinned_source("unsloth.models.rl"), "Unsloth's trainer rewrite", revisit,
                'create_new_function(\n        f"Unsloth{RLTrainer_name}",')
    assert_says(pinned_source("unsloth_zoo.compiler", "create_new_function"), "unsloth_zoo's create_new_function",
                revisit, "module_name = name")
    assert_says(pinned_source("unsloth_zoo.compiler", "_exec_verified_source"), "unsloth_zoo's module runner",
                revisit, "spec = importlib.util.spec_from_file_location(module_name, file_location)")


def test_unsloths_config_keeps_trls_group_scaling_for_dr_grpo_only_when_given_none():
    """Unsloth's GRPOConfig turns "group" (or True) off for dr_grpo, printing the Dr GRPO paper's advice, and makes
    None the group scaling: what ``configs.scale_rewards_argument`` gives it for the preset's recipe and the trial's
    copy of a run's config."""
    revisit = "agentenv_nb.train.presets.configs (scale_rewards_argument)"
    assert_says(pinned_source("unsloth.models.rl"), "Unsloth's GRPOConfig rewrite", revisit,
                '"if loss_type.lower() == \'dr_grpo\':\\n"\n            "    if scale_rewards == None:\\n"\n'
                '            "        scale_rewards = True\\n"\n'
                '            "    elif scale_rewards == True or scale_rewards == \'group\':\\n"')
