"""The trained model out of the notebook: its LoRA adapter, the merged 16-bit model (which transformers, vLLM or
Unsloth load), a GGUF (llama.cpp, Ollama, LM Studio) where Unsloth's exporter can run, and a push to the Hugging Face
Hub; then reloaded, to play it as a user would.

    hub_problem("you/qwen3-4b-gridsim")       # None, or one line: no token, or not a repo id (check it first)
    saved = export_model(model, tokenizer, "runs/gridsim/trained", gguf="q8_0", push_to_hub="you/qwen3-4b-gridsim")
    model, tokenizer = reload(saved["merged"], "24gb")

Unsloth's GGUF exporter converts with llama.cpp, which it downloads and builds when it isn't there
(``~/.unsloth/llama.cpp``, or ``UNSLOTH_LLAMA_CPP_PATH``). That takes minutes and a network, so it is the user's
choice (``build_llama_cpp``), said before the build starts; without it and without a built llama.cpp the GGUF is
skipped, saying how to have it. https://docs.unsloth.ai/basics/running-and-saving-models
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agentenv_nb import settings
from agentenv_nb.library_log import to_log
from agentenv_nb.stack import import_unsloth
from agentenv_nb.train import presets
from agentenv_nb.train.model import loading
from agentenv_nb.train.naming import NOTEBOOK, Naming

NO_LLAMA_CPP = ("GGUF skipped: Unsloth's exporter needs a built llama.cpp (llama-quantize and convert_hf_to_gguf.py) "
                "in {folder} or UNSLOTH_LLAMA_CPP_PATH, and none is there; {build} to let it download and build one "
                "(minutes, with a network, as on Colab), or build llama.cpp there yourself, "
                "https://github.com/ggml-org/llama.cpp, and export again")
BUILDING = ("GGUF: no built llama.cpp in {folder}, so Unsloth's exporter downloads and builds it now, which takes several "
            "minutes ({skip} skips the GGUF)")


def hub_problem(repo: str, naming: Naming = NOTEBOOK) -> str | None:
    """None where ``repo`` ("owner/name") can be pushed to with the token found (HF_TOKEN, a login, Colab's secret);
    else one line saying what to set, in ``naming``'s words. An empty ``repo`` pushes nothing, so it is no problem."""
    if not repo:
        return None
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
        if not re.fullmatch(r"[^/]+/[^/]+", repo):
            raise HFValidationError("not owner/name")
    except HFValidationError:
        return (f"{naming.given('push_to_hub', repr(repo))} is not a Hub repo id: give owner/name (e.g. "
                f"you/qwen3-4b-gridsim), or {naming.unset('push_to_hub')}")
    if not get_token():
        return (f"{naming.given('push_to_hub', repr(repo))} needs a Hugging Face token with write access: set HF_TOKEN "
                f"(on Colab, the secret HF_TOKEN), or {naming.unset('push_to_hub')}")
    return None


def llama_cpp_problem(naming: Naming = NOTEBOOK) -> str | None:
    """None where Unsloth's GGUF exporter finds a built llama.cpp; else why it can't run here, in one line in
    ``naming``'s words."""
    import_unsloth()  # unsloth_zoo imports only after unsloth
    from unsloth_zoo.llama_cpp import LLAMA_CPP_DEFAULT_DIR, check_llama_cpp

    try:
        check_llama_cpp(LLAMA_CPP_DEFAULT_DIR)
    except RuntimeError:
        build = (f"pass {naming.name('build_llama_cpp')}" if naming.command
                 else f"set {naming.given('build_llama_cpp', 'True')}")
        return NO_LLAMA_CPP.format(folder=LLAMA_CPP_DEFAULT_DIR, build=build)
    return None


def export_model(model, tokenizer, folder: str | Path, gguf: str = "q8_0", push_to_hub: str = "",
                 private: bool = True, build_llama_cpp: bool = False,
                 naming: Naming = NOTEBOOK) -> dict[str, str | None]:
    """Save ``folder/adapter`` (LoRA; none for a model trained in full) and ``folder/merged`` (16-bit), a GGUF of
    quantization ``gguf`` ("" for none) in ``folder/gguf`` where llama.cpp is built (or, with ``build_llama_cpp``,
    once Unsloth's exporter has built it), and upload the merged model (and GGUF) to the Hub repo ``push_to_hub``
    (private unless told otherwise). Refuses a push it can't make before saving anything (``hub_problem``). Returns
    where each went (None for what wasn't made) and says so, in ``naming``'s words; a GGUF that fails loses nothing
    else."""
    if problem := hub_problem(push_to_hub, naming):
        raise ValueError(problem)
    folder = Path(folder)
    merged = loading.save_warm_start(model, tokenizer, folder)
    saved = {"adapter": str(folder / "adapter") if (folder / "adapter").is_dir() else None, "merged": merged,
             "gguf": None, "hub": None}
    missing = gguf and llama_cpp_problem(naming)
    if gguf and (not missing or build_llama_cpp):
        if missing:
            from unsloth_zoo.llama_cpp import LLAMA_CPP_DEFAULT_DIR

            skip = naming.given("gguf", "''") if naming.command else naming.given("build_llama_cpp", "False")
            print(BUILDING.format(folder=LLAMA_CPP_DEFAULT_DIR, skip=skip), flush=True)
        try:
            saved["gguf"] = _gguf(model, tokenizer, folder / "gguf", gguf, offline=not missing)
        except Exception as error:  # a build or conversion that fails: the adapter and merged model are saved
            last = (str(error).strip().splitlines() or [""])[-1]
            print(f"GGUF not made: {type(error).__name__}: {last} ({settings.get('library_log')} has the rest)")
    elif gguf:
        print(missing)
    if push_to_hub:
        saved["hub"] = _push(push_to_hub, [Path(merged), *([Path(saved["gguf"])] if saved["gguf"] else [])], private)
    for what, where in saved.items():
        if where:
            print(f"{what}: {where}")
    return saved


def _gguf(model, tokenizer, folder: Path, quantization: str, offline: bool = True) -> str:
    """Unsloth's GGUF export; ``offline`` (``UNSLOTH_LLAMA_CPP_OFFLINE``): the llama.cpp found converts, nothing is
    downloaded."""
    if not offline:
        with to_log("building llama.cpp and exporting the GGUF"):
            model.save_pretrained_gguf(str(folder), tokenizer, quantization_method=quantization)
        return str(folder)
    before, os.environ["UNSLOTH_LLAMA_CPP_OFFLINE"] = os.environ.get("UNSLOTH_LLAMA_CPP_OFFLINE"), "1"
    try:
        with to_log("exporting the GGUF"):
            model.save_pretrained_gguf(str(folder), tokenizer, quantization_method=quantization)
    finally:
        if before is None:
            os.environ.pop("UNSLOTH_LLAMA_CPP_OFFLINE")
        else:
            os.environ["UNSLOTH_LLAMA_CPP_OFFLINE"] = before
    return str(folder)


def _push(repo: str, folders: list[Path], private: bool) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo, private=private, exist_ok=True)
    for folder in folders:
        api.upload_folder(repo_id=repo, folder_path=folder, path_in_repo="gguf" if folder.name == "gguf" else "",
                          commit_message=f"agentenv_nb: the trained model ({folder.name})")
    return str(url)


def reload(folder: str | Path, preset: str):
    """The exported model loaded as ``preset`` loads a model to play (4-bit on "24gb"), with no adapter and no vLLM
    engine beside the trainer's: returns (model, tokenizer)."""
    import_unsloth()
    from unsloth import FastLanguageModel

    with to_log("reloading the model"):
        return FastLanguageModel.from_pretrained(**presets.model_kwargs(preset, str(folder), fast_inference=False))
