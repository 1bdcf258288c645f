"""Where users run the notebooks, decided from what each host's probes read: the set installed, the preset, the
engine, the precision and the line each user sees; the set-up step run for real here; and preflight's rows for a
host whose driver, vLLM, card or precision doesn't fit.

The hosts are given as their probes would read them (Colab and Kaggle can't exist here): the driver and the CUDA its
branch runs, each GPU's compute capability and memory as nvidia-smi reports them, and the runtime's own torch.
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from agentenv_nb.host.install import commands, download_bytes, downloads, how_long, refusal, reports_bytes, set_up
from agentenv_nb.host.plan import plan_for, plan_here, with_stack
from agentenv_nb.host.probe import Host, cuda_of_driver, read_host
from agentenv_nb.host.stacks import STACKS
from agentenv_nb.notebook import preflight as pf
from agentenv_nb.train import presets
from agentenv_nb.train.presets import PRESETS

# Colab as it is now: driver 580.82.07 (CUDA 13.0), torch 2.11.0+cu130, Python 3.13 on its T4, L4 and A100 runtimes
COLAB_T4 = {"notebook": "colab", "driver": "580.82.07", "gpus": [("Tesla T4", "7.5", 15.0)],
            "torch": "2.11.0+cu130", "torch_cuda": "13.0", "python": "3.13.15"}
# A CUDA-12 host, as many own machines and clouds still are (535-570 drivers), with a CUDA-12 torch
CUDA12_L4 = {"notebook": "jupyter", "driver": "570.172.08", "gpus": [("NVIDIA L4", "8.9", 22.5)],
             "torch": "2.11.0+cu128", "torch_cuda": "12.8", "python": "3.12.12"}
HOSTS = {
    "colab-t4": COLAB_T4,
    "colab-l4": {**COLAB_T4, "gpus": [("NVIDIA L4", "8.9", 22.5)]},
    "colab-a100": {**COLAB_T4, "gpus": [("NVIDIA A100-SXM4-40GB", "8.0", 40.0)]},
    "cuda12-l4": CUDA12_L4,
    "cuda12-a100-no-torch": {**CUDA12_L4, "driver": "535.247.01", "gpus": [("NVIDIA A100-SXM4-80GB", "8.0", 80.0)],
                             "torch": None, "torch_cuda": None},
    "kaggle-2xt4": {"notebook": "kaggle", "driver": "560.35.03", "gpus": [("Tesla T4", "7.5", 15.0)] * 2,
                    "torch": "2.11.0+cu128", "torch_cuda": "12.8", "python": "3.12.12"},
    "h100-cuda13": {"notebook": "jupyter", "driver": "580.95.05", "gpus": [("NVIDIA H100 80GB HBM3", "9.0", 79.6)],
                    "torch": None},
    "h200-cuda13": {"driver": "580.159.04", "gpus": [("NVIDIA H200", "9.0", 140.4)], "torch": "2.11.0+cu130",
                    "torch_cuda": "13.0", "python": "3.12.3"},
    "h200-torch-2.13": {"driver": "580.159.04", "gpus": [("NVIDIA H200", "9.0", 140.4)], "torch": "2.13.0+cu130",
                        "torch_cuda": "13.0"},
    "colab-cpu": {"notebook": "colab", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "python": "3.13.15"},
    "t4-box-no-torch": {"notebook": "jupyter", "driver": "550.54.15", "gpus": [("Tesla T4", "7.5", 15.0)]},
    "old-driver": {"driver": "470.239.06", "gpus": [("Tesla T4", "7.5", 15.0)], "torch": "2.11.0+cu128",
                   "torch_cuda": "12.8"},
    "kaggle-p100": {"notebook": "kaggle", "driver": "560.35.03", "gpus": [("Tesla P100-PCIE-16GB", "6.0", 16.0)],
                    "torch": "2.11.0+cu128", "torch_cuda": "12.8", "python": "3.12.12"},
}
KEPT_WITH_VLLM = ("since vLLM 0.26.0 is built for its torch 2.11.0+cu130, which runs on this driver: the runtime's "
                  "torch stays, and nothing of it (torch, triton, NCCL, cuDNN) is downloaded again; trains in bf16 on "
                  "Unsloth's vLLM with the '24gb' preset")
# host: (set, preset, engine, precision, the whole line)
DECIDED = {
    "colab-t4": ("runtime", "16gb", "generate", "fp16",
                 "agentenv_nb: Colab, Tesla T4 (7.5, 15 GB), driver 580.82.07 (CUDA 13.0), torch 2.11.0+cu130, Python "
                 "3.13 -> the 'runtime' set (the runtime's torch 2.11.0+cu130 kept, no vLLM), since Tesla T4 (compute "
                 "capability 7.5) has no bf16 and no vLLM build of these sets, and its own torch 2.11.0+cu130 runs on "
                 "this driver; trains in fp16 on transformers' generate with the '16gb' preset"),
    "colab-l4": ("runtime-2.11-vllm", "24gb", "vllm", "bf16",
                 "agentenv_nb: Colab, NVIDIA L4 (8.9, 22 GB), driver 580.82.07 (CUDA 13.0), torch 2.11.0+cu130, Python "
                 "3.13 -> the 'runtime-2.11-vllm' set (the runtime's torch 2.11.0+cu130 kept, with vLLM 0.26.0 built "
                 "for it), " + KEPT_WITH_VLLM),
    "colab-a100": ("runtime-2.11-vllm", "24gb", "vllm", "bf16",
                   "agentenv_nb: Colab, NVIDIA A100-SXM4-40GB (8.0, 40 GB), driver 580.82.07 (CUDA 13.0), torch "
                   "2.11.0+cu130, Python 3.13 -> the 'runtime-2.11-vllm' set (the runtime's torch 2.11.0+cu130 kept, "
                   "with vLLM 0.26.0 built for it), " + KEPT_WITH_VLLM),
    "cuda12-l4": ("cuda12", "24gb", "vllm", "bf16",
                  "agentenv_nb: Jupyter, NVIDIA L4 (8.9, 22 GB), driver 570.172.08 (CUDA 12.8), torch 2.11.0+cu128, "
                  "Python 3.12 -> the 'cuda12' set (torch 2.10.0 and vLLM 0.19.1, CUDA 12.8 builds), since its driver "
                  "runs CUDA 12.8, and vLLM's CUDA-13 wheels (0.20.0 on) need CUDA 13; trains in bf16 on Unsloth's "
                  "vLLM with the '24gb' preset"),
    "cuda12-a100-no-torch": ("cuda12", "24gb", "vllm", "bf16",
                             "agentenv_nb: Jupyter, NVIDIA A100-SXM4-80GB (8.0, 80 GB), driver 535.247.01 (CUDA 12.2), "
                             "no torch, Python 3.12 -> the 'cuda12' set (torch 2.10.0 and vLLM 0.19.1, CUDA 12.8 "
                             "builds), since its driver runs CUDA 12.2, and vLLM's CUDA-13 wheels (0.20.0 on) need "
                             "CUDA 13; trains in bf16 on Unsloth's vLLM with the '24gb' preset"),
    "kaggle-2xt4": ("runtime", "16gb", "generate", "fp16",
                    "agentenv_nb: Kaggle, 2 x Tesla T4 (7.5, 15 GB), driver 560.35.03 (CUDA 12.6), torch 2.11.0+cu128, "
                    "Python 3.12 -> the 'runtime' set (the runtime's torch 2.11.0+cu128 kept, no vLLM), since Tesla T4 "
                    "(compute capability 7.5) has no bf16 and no vLLM build of these sets, and its own torch "
                    "2.11.0+cu128 runs on this driver; trains in fp16 on transformers' generate with the '16gb' "
                    "preset"),
    "h100-cuda13": ("cuda13", "24gb", "vllm", "bf16",
                    "agentenv_nb: Jupyter, NVIDIA H100 80GB HBM3 (9.0, 80 GB), driver 580.95.05 (CUDA 13.0), no torch "
                    "-> the 'cuda13' set (torch 2.13.0 and vLLM 0.29.0, CUDA 13.0 builds), since its driver runs CUDA "
                    "13.0; trains in bf16 on Unsloth's vLLM with the '24gb' preset"),
    "h200-cuda13": ("runtime-2.11-vllm", "24gb", "vllm", "bf16",
                    "agentenv_nb: this machine, NVIDIA H200 (9.0, 140 GB), driver 580.159.04 (CUDA 13.0), torch "
                    "2.11.0+cu130, Python 3.12 -> the 'runtime-2.11-vllm' set (the runtime's torch 2.11.0+cu130 kept, "
                    "with vLLM 0.26.0 built for it), " + KEPT_WITH_VLLM),
    "h200-torch-2.13": ("cuda13", "24gb", "vllm", "bf16",
                        "agentenv_nb: this machine, NVIDIA H200 (9.0, 140 GB), driver 580.159.04 (CUDA 13.0), torch "
                        "2.13.0+cu130 -> the 'cuda13' set (torch 2.13.0 and vLLM 0.29.0, CUDA 13.0 builds), since its "
                        "driver runs CUDA 13.0; trains in bf16 on Unsloth's vLLM with the '24gb' preset"),
    "colab-cpu": ("runtime", "cpu-tiny", "generate", "fp32",
                  "agentenv_nb: Colab, no GPU, torch 2.11.0+cu130, Python 3.13 -> the 'runtime' set (the runtime's "
                  "torch 2.11.0+cu130 kept, no vLLM), since no GPU: the runtime's torch serves the CPU preset; trains "
                  "in fp32 on transformers' generate with the 'cpu-tiny' preset"),
    "t4-box-no-torch": ("cuda12-no-vllm", "16gb", "generate", "fp16",
                        "agentenv_nb: Jupyter, Tesla T4 (7.5, 15 GB), driver 550.54.15 (CUDA 12.4), no torch -> the "
                        "'cuda12-no-vllm' set (torch 2.10.0, a CUDA 12.8 build, no vLLM), since Tesla T4 (compute "
                        "capability 7.5) has no bf16 and no vLLM build of these sets, and its driver runs CUDA 12.4; "
                        "trains in fp16 on transformers' generate with the '16gb' preset"),
}
BLOCKED = {
    "old-driver": ("agentenv_nb: this machine, Tesla T4 (7.5, 15 GB), driver 470.239.06 (CUDA 11.4), torch "
                   "2.11.0+cu128: this driver runs CUDA 11.4, older than every known set (CUDA 12.0 or newer); update "
                   "the NVIDIA driver to the 525 branch or newer (580+ for the CUDA-13 set); on a notebook host, pick "
                   "another GPU runtime"),
    "kaggle-p100": ("agentenv_nb: Kaggle, Tesla P100-PCIE-16GB (6.0, 16 GB), driver 560.35.03 (CUDA 12.6), torch "
                    "2.11.0+cu128, Python 3.12: Tesla P100-PCIE-16GB has compute capability 6.0: today's torch builds "
                    "have no kernels for it, and Unsloth needs 7.0 or newer; pick a T4 or newer GPU (Kaggle: Settings "
                    "-> Accelerator -> GPU T4 x2)"),
}


def host(name: str) -> Host:
    return Host.from_dict(HOSTS[name])


@pytest.mark.parametrize("name", DECIDED)
def test_each_host_gets_the_set_preset_engine_and_precision_that_fit_it_and_the_line_says_so(name):
    plan = plan_for(host(name))
    stack, preset, engine, precision, line = DECIDED[name]
    assert (plan.stack.name, plan.preset, plan.engine, plan.precision) == (stack, preset, engine, precision)
    assert plan.line() == line


@pytest.mark.parametrize("name", BLOCKED)
def test_a_host_no_set_fits_gets_one_line_saying_what_to_do_and_installs_nothing(name, capsys):
    plan = plan_for(host(name))
    assert plan.stack is None
    assert set_up(plan) == 1
    assert capsys.readouterr().out.splitlines() == [BLOCKED[name]]


def test_the_lines_docs_hosts_prints_are_the_planners():
    """Each line in docs/hosts.md's examples is one the planner prints for a host of this file's table."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "hosts.md").read_text()
    shown = [" ".join(block.split()) for block in re.findall(r"```\n(agentenv_nb: .*?)```", text, re.DOTALL)]
    assert len(shown) >= 3
    printed = {" ".join(plan_for(host(name)).line().split()) for name in HOSTS}
    assert [line for line in shown if line not in printed] == []


def test_drivers_by_branch():
    assert [cuda_of_driver(d) for d in ("580.159.04", "570.86.15", "550.54.15", "525.60.13", "470.239.06")] == [
        (13, 0), (12, 8), (12, 4), (12, 0), (11, 4)]


def test_what_the_set_up_runs_on_a_colab_t4_keeps_its_torch():
    """The runtime's torch is pinned as it is, so nothing the set installs replaces it; no vLLM; xformers, built for
    torch 2.10 only, removed where it is installed."""
    plan = plan_for(host("colab-t4"))
    [install, *rest] = commands(plan, python="python3")  # here: what this machine misses of that set
    assert install[:5] == ["python3", "-m", "pip", "install", "-q"] and install[5] == "torch==2.11.0+cu130"
    pins = set(plan.stack.requirements(plan.keep_torch))
    assert {"unsloth==2026.10.9", "trl==1.15.0", "transformers==5.17.0", "bitsandbytes==0.50.2"} <= pins
    assert not any(pin.startswith(("vllm", "torch==2.13")) for pin in pins)
    assert all(command[3] == "uninstall" for command in rest)


def test_the_cuda12_set_swaps_torch_and_vllm_and_keeps_every_other_pin():
    cuda12, cuda13 = STACKS["cuda12"].requirements(), STACKS["cuda13"].requirements()
    assert {"torch==2.10.0", "vllm==0.19.1"} <= set(cuda12) and not any(p.startswith("vllm-bnb") for p in cuda12)
    assert set(cuda12) - {"torch==2.10.0", "vllm==0.19.1"} == set(cuda13) - {
        "torch==2.13.0", "vllm==0.29.0", "vllm-bnb-plugin==0.0.3"}
    assert STACKS["cuda12"].uninstalls == () and STACKS["cuda13"].uninstalls == ("xformers",)


def test_a_set_whose_torch_the_driver_cant_run_is_refused_before_anything_installs(capsys):
    """A user on a CUDA-12 host naming the pinned CUDA-13 set would get a multi-gigabyte install and no GPU."""
    plan = with_stack(plan_for(host("cuda12-l4")), STACKS["cuda13"], "--stack cuda13 names it")
    assert refusal(plan) and set_up(plan) == 1
    out = capsys.readouterr().out.splitlines()[-1]
    assert out == ("agentenv_nb: the 'cuda13' set's torch is a CUDA 13.0 build, and this driver (570.172.08) runs CUDA "
                   "12.8 at most: installed, it would leave no GPU. Run the set-up without --stack; it picks 'cuda12' "
                   "here")
    assert refusal(with_stack(plan_for(host("h100-cuda13")), STACKS["cuda12"], "--stack cuda12")) is None
    assert with_stack(plan_for(host("h100-cuda13")), STACKS["runtime"], "named").engine == "generate"
    named_on_an_old_driver = with_stack(plan_for(host("old-driver")), STACKS["cuda12"], "--stack cuda12")
    assert refusal(named_on_an_old_driver).endswith("update the NVIDIA driver to the 525 branch or newer (580+ for the "
                                                    "CUDA-13 set); on a notebook host, pick another GPU runtime")


def test_the_set_up_step_here_reads_this_host_and_has_nothing_to_do():
    """CI's machine, as set up by .ci/setup (the set-up step itself): the runtime's CPU torch kept, every pin met."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "agentenv_nb.host"], capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert done.returncode == 0 and done.stderr == "", done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("agentenv_nb: ") and "no GPU" in first and "'cpu-tiny' preset" in first
    assert second == f"agentenv_nb: the '{plan_here().stack.name}' set is installed; nothing to do"
    assert seconds < 30, "the set-up step re-run takes seconds"  # a bound on a hang, not a benchmark


def test_the_probes_read_this_machine_without_importing_torch():
    code = "import sys; from agentenv_nb.host.probe import read_host; h = read_host(); print(h.torch, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    version, imported = done.stdout.split()
    import torch

    # the installed distribution's version, which a kept torch's pin must match: PyPI's CUDA build says "2.13.0" in
    # its metadata and "2.13.0+cu130" in torch.__version__
    assert version == importlib.metadata.version("torch") and torch.__version__.startswith(version)
    assert imported == "False"
    assert read_host().gpus == () and read_host().torch_cuda == (
        tuple(map(int, torch.version.cuda.split(".")[:2])) if torch.version.cuda else None)


def test_preflight_says_a_driver_too_old_for_the_installed_torch():
    cuda13_torch_on_cuda12 = Host.from_dict({**HOSTS["t4-box-no-torch"], "torch": "2.13.0+cu130", "torch_cuda": "13.0"})
    [driver] = [row for row in pf.check_host(PRESETS["16gb"], cuda13_torch_on_cuda12) if row["check"] == "driver"]
    assert driver["status"] == "fail" and "built for CUDA 13.0; this driver (550.54.15) runs CUDA 12.4" in driver["detail"]
    assert "python -m agentenv_nb.host" in driver["fix"] and "'cuda12-no-vllm' set" in driver["fix"]
    assert not [row for row in pf.check_host(PRESETS["16gb"], host("colab-t4")) if row["check"] == "driver"]


def test_preflight_says_a_card_without_bf16_and_a_card_too_small(monkeypatch):
    t4 = host("colab-t4")
    rows = {row["check"]: row for row in pf.check_host(PRESETS["24gb"], t4)}
    assert rows["precision"]["status"] == "ok" and rows["precision"]["detail"] == "trains in fp16 on Tesla T4"
    assert rows["card"]["status"] == "fail" and "made for a 24 GB card; Tesla T4 has 15 GB" in rows["card"]["detail"]
    assert rows["card"]["fix"].startswith("PRESET='16gb'")
    assert "card" not in {row["check"] for row in pf.check_host(PRESETS["16gb"], t4)}
    monkeypatch.setenv("AGENTENV_NB_PRECISION", "bf16")
    [precision] = [row for row in pf.check_host(PRESETS["16gb"], t4) if row["check"] == "precision"]
    assert precision["status"] == "fail" and "Unsloth loads the model in float16 there" in precision["detail"]
    assert "AGENTENV_NB_PRECISION=fp16" in precision["fix"]


def test_versions_are_checked_against_the_hosts_set_and_the_fix_is_the_set_up_step():
    """Never `pip install torch==2.13.0` as a fix: on a CUDA-12 driver that is the install that leaves no GPU."""
    rows = pf.check_versions(PRESETS["16gb"], Host.from_dict({**HOSTS["t4-box-no-torch"], "torch": "2.13.0+cu130",
                                                     "torch_cuda": "13.0"}))
    assert "the 'cuda12-no-vllm' set" in rows[0]["detail"]
    [torch_row] = [row for row in rows if row["check"] == "version torch"]
    assert "pins torch==2.10.0" in torch_row["detail"] and "python -m agentenv_nb.host" in torch_row["fix"]
    assert not any("pip install" in row["fix"] for row in rows)


def test_the_precision_a_preset_trains_in_reaches_the_configs(monkeypatch):
    """fp16 where the card has no bf16 (the setting stands in for a T4's reading here), bf16 on the card a GPU
    preset is made for, fp32 on the CPU preset; a model loaded in float16 to match."""
    assert (presets.sft_kwargs("16gb")["bf16"], presets.sft_kwargs("16gb")["fp16"]) == (True, False)
    assert (presets.grpo_kwargs("cpu-tiny")["bf16"], presets.grpo_kwargs("cpu-tiny")["fp16"]) == (False, False)
    monkeypatch.setenv("AGENTENV_NB_PRECISION", "fp16")
    for kwargs in (presets.grpo_kwargs("16gb"), presets.sft_kwargs("16gb")):
        assert (kwargs["bf16"], kwargs["fp16"]) == (False, True)
    import torch

    assert presets.model_kwargs("16gb", "m", fast_inference=False)["dtype"] is torch.float16
    assert presets.grpo_kwargs("cpu-tiny")["fp16"] is False  # the CPU preset's own precision stands


def test_the_16gb_preset_is_the_24gb_recipe_at_half_the_rollouts():
    difference = presets.differences("24gb", "16gb")
    assert difference["gradient_accumulation_steps"] == (4, 2) and difference["gpu_gb"] == (24.0, 15.0)
    assert presets.PRESETS["16gb"].num_generations == 8 and presets.PRESETS["16gb"].load_in_4bit


def test_auto_is_the_preset_that_fits_this_host(capsys):
    assert presets.named("auto").name == "cpu-tiny"  # no GPU here
    with pytest.raises(ValueError, match=r"choose one of \('auto', '24gb'"):
        presets.named("8gb")


BROKEN_VLLM = """
import os, subprocess, sys
from pathlib import Path
root = Path(sys.argv[1])
package = root / "vllm"
package.mkdir(parents=True)
(package / "__init__.py").write_text("")
(root / "cuda13stub.c").write_text("int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }")
(root / "ext.c").write_text("int cudaRuntimeGetVersion(int *); int probe(void) { int v; return cudaRuntimeGetVersion(&v); }")
subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.99", "-o", root / "libcudart.so.99",
                root / "cuda13stub.c"], check=True)
subprocess.run(["cc", "-shared", "-fPIC", "-o", package / "_C.abi3.so", root / "ext.c", root / "libcudart.so.99"],
               check=True)
(root / "libcudart.so.99").unlink()  # a CUDA runtime this machine hasn't got (it has CUDA 13's)
(package / "METADATA").write_text("")
info = root / "vllm-0.29.0.dist-info"
info.mkdir()
(info / "METADATA").write_text("Metadata-Version: 2.1\\nName: vllm\\nVersion: 0.29.0\\n")
"""


def test_a_vllm_built_for_another_cuda_imports_but_is_found_broken(tmp_path):
    """As on Colab with vLLM's CUDA-13 wheel: ``import vllm`` passes, and its compiled extension can't open the CUDA
    runtime it was linked against (there libcudart.so.13). A real shared object, linked against a library that is
    then taken away."""
    subprocess.run([sys.executable, "-c", BROKEN_VLLM, str(tmp_path)], check=True, timeout=60)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm; "
            "from agentenv_nb.notebook.preflight import check_vllm; from agentenv_nb.train.presets import PRESETS; "
            "row, = check_vllm(PRESETS['24gb']); "
            "print(row['status']); print(row['detail']); print(row['fix'])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    status, detail, fix = done.stdout.splitlines()[-3:]
    assert status == "warn", done.stderr[-2000:]
    assert detail.startswith("vllm 0.29.0 doesn't load here (ImportError: libcudart.so.99: cannot open shared object")
    assert "transformers' generate instead" in detail and "python -m agentenv_nb.host" in fix


def test_a_stack_setting_that_names_no_known_set_is_refused_in_one_line():
    env = {**os.environ, "AGENTENV_NB_STACK": "cuda11"}
    done = subprocess.run([sys.executable, "-m", "agentenv_nb.host", "--dry-run"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("python -m agentenv_nb.host: AGENTENV_NB_STACK='cuda11' isn't one of cuda13, cuda12, runtime")


def test_a_colab_l4_keeps_its_torch_and_adds_the_vllm_built_for_it():
    """vLLM 0.26.0 pins torch 2.11.0, Colab's: the set-up installs the trainer stack and vLLM, and holds the runtime's
    torch where it is; vLLM 0.26.0 loads 4-bit through its own bitsandbytes support, so vllm-bnb-plugin stays out."""
    plan = plan_for(host("colab-l4"))
    [install, *rest] = commands(plan, python="python3")
    assert install[:6] == ["python3", "-m", "pip", "install", "-q", "torch==2.11.0+cu130"]
    pins = set(plan.stack.requirements(plan.keep_torch))
    cuda13 = set(STACKS["cuda13"].requirements())
    assert pins - {"torch==2.11.0+cu130", "vllm==0.26.0"} == cuda13 - {"torch==2.13.0", "vllm==0.29.0",
                                                                        "vllm-bnb-plugin==0.0.3"}
    assert "vllm==0.26.0" in install and not any(pin.startswith("vllm-bnb") for pin in install)
    assert refusal(plan) is None and all(command[3] == "uninstall" for command in rest)


def test_the_set_keeping_torch_2_11_is_refused_beside_another_torch(capsys):
    """Named on a runtime whose torch isn't 2.11 (or is a CUDA-12 build), its vLLM can't be installed beside it."""
    named = STACKS["runtime-2.11-vllm"]
    on_torch_2_13 = with_stack(plan_for(host("h200-torch-2.13")), named, "--stack runtime-2.11-vllm names it")
    assert set_up(on_torch_2_13) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "agentenv_nb: the 'runtime-2.11-vllm' set keeps the runtime's torch 2.11 (a CUDA 13.0 build) and adds the vLLM "
        "built for it; this runtime has torch 2.13.0+cu130. Run the set-up without --stack; it picks 'cuda13' here")
    assert "this runtime has torch 2.11.0+cu128" in refusal(with_stack(plan_for(host("cuda12-l4")), named, "named"))
    assert "this runtime has no torch" in refusal(with_stack(plan_for(host("h100-cuda13")), named, "named"))


RECORDED = Path(__file__).with_name("data") / "setup_report_torch2.11_vllm.json"


def test_the_set_up_says_its_download_and_time_before_it_starts():
    """A Colab L4's set-up, from pip's recorded report of what it installs there and each file's recorded size: the
    trainer stack and vLLM, where the pinned set would download torch and its CUDA libraries again."""
    recorded = json.loads(RECORDED.read_text())
    size = reports_bytes([recorded["report"]], recorded["content_length"].get)
    fetched = [n for url, n in recorded["content_length"].items() if url.startswith("https://")]  # not a local mirror's
    assert size == sum(fetched) and 1.2e9 < size < 1.5e9
    assert how_long(size, STACKS["runtime-2.11-vllm"].minutes) == "about 1.3 GB, a few minutes"
    assert how_long(7.4e9, 6) == "about 7.4 GB, about 8 minutes"
    assert how_long(0.2e9, 6) == "about 0.2 GB, about a minute"
    one_unknown = {**recorded["content_length"], downloads(recorded["report"])[0]: None}
    assert reports_bytes([recorded["report"]], one_unknown.get) is None


def test_with_no_index_to_ask_the_set_up_says_the_sets_own_minutes():
    nowhere = [sys.executable, "-m", "pip", "install", "-q", "agentenv-nb-absent==1.0", "--no-cache-dir",
               "--index-url", "http://127.0.0.1:9/simple", "--isolated"]
    assert download_bytes([nowhere]) is None
    assert how_long(None, 6) == "about 6 minutes" and how_long(None, 3) == "a few minutes"


def test_the_gpu_machine_keeps_its_own_libraries_only_for_a_set_of_their_cuda():
    """bench/gpu_stack.py over the GPU machine's description (bench/gpu_machine.toml): its CUDA 13.0 libraries serve the
    CUDA-13 sets, so the CUDA-12 set carries its own; the set keeping torch 2.11 keeps the machine's and carries vLLM."""
    spec = importlib.util.spec_from_file_location("gpu_stack", Path(__file__).resolve().parents[1] / "bench" /
                                                  "gpu_stack.py")
    gpu_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_stack)

    def carried(stack: str, name: str, version: str) -> bool:
        desc, _, _ = gpu_stack.for_stack(gpu_stack.machine(), stack)
        return gpu_stack.kept({"name": name, "version": version}, desc) is None

    assert carried("cuda12", "torch", "2.10.0") and carried("cuda12", "nvidia-cublas-cu12", "12.8.4.1")
    assert carried("cuda12", "nvidia-cudnn-cu12", "9.10.2.21") and carried("cuda12", "nvidia-nccl-cu12", "2.27.5")
    assert not carried("cuda13", "nvidia-cublas", "13.1.0.3") and carried("cuda13", "nvidia-nccl-cu13", "2.29.7")
    assert not carried("runtime-2.11-vllm", "torch", "2.11.0") and not carried("runtime-2.11-vllm", "triton", "3.6.0")
    assert not carried("runtime-2.11-vllm", "nvidia-nccl-cu13", "2.28.9")
    assert carried("runtime-2.11-vllm", "vllm", "0.26.0") and carried("runtime-2.11-vllm", "nvidia-cudnn-frontend", "1.28.0")
    _, pins, _ = gpu_stack.for_stack(gpu_stack.machine(), "runtime-2.11-vllm")
    assert {"torch==2.11.0", "vllm==0.26.0"} <= set(pins) and not any(pin.startswith("vllm-bnb") for pin in pins)


def test_the_gpu_machine_installs_a_carried_set_once_its_last_part_comes(tmp_path):
    """bench/gpu_stack.py receive, part by part, of wheels that share a folder as NVIDIA's share cuda/ and nvidia/,
    which the machine's cores unpack at once."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for n in range(32):
        with zipfile.ZipFile(wheels / f"lib{n}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr("cuda/", "")
            wheel.writestr(f"cuda/lib{n}/__init__.py", f"N = {n}\n")
            script = zipfile.ZipInfo(f"lib{n}-1.0.data/scripts/tool{n}")
            script.external_attr = 0o755 << 16
            wheel.writestr(script, "#!/bin/sh\n")
    with tarfile.open(tmp_path / "stack.tar", "w") as tar:
        for wheel in sorted(wheels.iterdir()):
            tar.add(wheel, arcname=wheel.name)
    whole = (tmp_path / "stack.tar").read_bytes()
    third = -(-len(whole) // 3)
    manifest = {"sha256": hashlib.sha256(whole).hexdigest(), "bytes": len(whole), "parts": 3, "stack": "cuda12",
                "wheels": [f"lib{n}==1.0" for n in range(32)]}
    machine = tmp_path / "machine.toml"
    machine.write_text(f'site = "{tmp_path / "site"}"\n')
    gpu_stack = [sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "gpu_stack.py"), "--machine",
                 str(machine)]
    for index in (1, 2, 3):
        part = tmp_path / "parts" / f"{index:02d}"
        part.mkdir(parents=True)
        (part / "chunk").write_bytes(whole[(index - 1) * third:index * third])
        (part / "manifest.json").write_text(json.dumps({**manifest, "index": index}))
        got = subprocess.run([*gpu_stack, "receive", str(part)], capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
        where = subprocess.run([*gpu_stack, "path", "--stack", "cuda12"], capture_output=True, text=True)
        assert (where.returncode == 0) == (index == 3)  # installed once the last part is there, not before
    installed = tmp_path / "site-cuda12" / "site-packages"
    assert where.stdout.strip() == str(installed)
    assert sorted(int(p.read_text().split()[-1]) for p in installed.glob("cuda/lib*/__init__.py")) == list(range(32))
    assert all(os.access(installed / "bin" / f"tool{n}", os.X_OK) for n in range(32))
    assert sorted(p.name for p in (tmp_path / "site-cuda12").iterdir()) == ["installed.json", "site-packages"]
