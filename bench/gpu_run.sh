#!/usr/bin/env bash
# The GPU proof in ONE run on the GPU machine, within a deadline. Unpacks the archive that bench/gpu_site.sh made
# (carry it with the working tree) to GPU_SITE_DIR, puts it and the repo on PYTHONPATH, builds the random
# Qwen3-4B-shaped model once in MODEL_DIR, then runs the parts, most important first, each under `timeout`:
#
#   grpo      bench/gpu_grpo.py: the kit, bare Unsloth, plain TRL; 4-bit, GPU held to 24 GB -> OUT/grpo_24gb.json
#   generate  optional: the same, vLLM off the path: transformers' generate -> OUT/grpo_24gb_generate.json
#   sft       bench/gpu_sft.py: notebook 02's SFT, 4-bit, 24 GB                              -> OUT/sft_24gb.json
#   test      pytest tests/gpu, vLLM off the path: a 4-bit GRPO step through AgentEnv whose rollouts call tools
#             -> OUT/pytest.xml
#   vllm-test optional: the same with vLLM (fast_inference=True)                      -> OUT/pytest_vllm.xml
#   16bit     optional: bench/gpu_grpo.py --preset 16bit --no-cap (GRPO16_VARIANTS: kit) -> OUT/grpo_16bit_nocap.json
#
# vLLM (the colocated path) is on the path when bench/gpu_ship.sh has unpacked it to GPU_VLLM_SITE_DIR; the presets
# then generate with it (grpo, 16bit, vllm-test). GPU_KIT_DIR, if set, is imported ahead of the repository (a
# snapshot of agentenv_nb taken when the run was sent).
#
# A part that no longer fits before the deadline is skipped, saying so (run it in a later call). Everything printed
# also goes to OUT/run.log. The site folder and the model are reused when they are still there from an earlier run.
# What this assumes about the GPU machine (its Python, torch, the site folder's place) is in bench/gpu_machine.env;
# see docs/benchmarks.md, "Running the GPU benchmarks".
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: bash bench/gpu_run.sh [OPTIONS] [PARTS]

Run the GPU benchmarks on the GPU machine, from the repository's root there, within a deadline.
PARTS: comma-separated, from grpo,generate,sft,test,vllm-test,16bit (default grpo,sft,test; "none" only unpacks and
builds the model).

Options (each has an environment variable; a flag wins over it):
  --smoke                the same parts on this machine's CPU, with a tiny model (the archive is only unpacked)
  --python PY            Python that runs the parts [BENCH_PYTHON; default: on the GPU machine GPU_PYTHON
                         (python3), with --smoke .venv/bin/python if present, else python3]
  --archive FILE         the archive from bench/gpu_site.sh [GPU_SITE_ARCHIVE; default .gpu/site.tar.xz];
                         "none": no archive, the machine's Python has the kit's packages itself
  --site-dir DIR         where to unpack it on the GPU machine [GPU_SITE_DIR; default in bench/gpu_machine.env]
  --model-dir DIR        where to build the random Qwen3-4B-shaped model [MODEL_DIR; default /tmp/q4b]
  --out DIR              results and run.log [OUT; default bench-out]
  --deadline S           seconds for the whole run [DEADLINE_S; default 585]
  --machine-env FILE     the GPU machine's description [GPU_MACHINE_ENV; default bench/gpu_machine.env]
  -h, --help             print this and exit

More settings, by environment variable: GRPO_BUDGET_S (150): training seconds a GRPO variant may take;
GRPO_VARIANTS (kit,bare,trl): the grpo part's variants; GRPO16_VARIANTS (kit): the 16bit part's;
GRPO_ARGS: more options of bench/gpu_grpo.py for the grpo part (e.g. "--set steps_per_generation=1");
GENERATE_VARIANTS (bare) and GENERATE_ARGS: the generate part's; GPU_KIT_DIR: agentenv_nb imported from there first.
Relative paths are taken from the repository root.
EOF
}

PARTS=grpo,sft,test SMOKE=0
while (( $# )); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --smoke) SMOKE=1 ;;
    --python|--archive|--site-dir|--model-dir|--out|--deadline|--machine-env)
      (( $# >= 2 )) || { echo "gpu_run.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --python) BENCH_PYTHON=$2 ;;
        --archive) GPU_SITE_ARCHIVE=$2 ;;
        --site-dir) GPU_SITE_DIR=$2 ;;
        --model-dir) MODEL_DIR=$2 ;;
        --out) OUT=$2 ;;
        --deadline) DEADLINE_S=$2 ;;
        --machine-env) GPU_MACHINE_ENV=$2 ;;
      esac
      shift ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    -*) echo "gpu_run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) PARTS=$1 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
source bench/load_machine.sh  # the GPU machine's description: MACHINE_ENV
ARCHIVE=${GPU_SITE_ARCHIVE:-.gpu/site.tar.xz}
MODEL_DIR=${MODEL_DIR:-/tmp/q4b}
export OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
DEADLINE=${DEADLINE_S:-585}
export PYTHONUNBUFFERED=1 TRL_EXPERIMENTAL_SILENCE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
say() { echo "[$(date +%T) +${SECONDS}s] $*"; }

part() {  # part NAME MIN_S MAX_S COMMAND...: run COMMAND under timeout if at least MIN_S seconds are left
  local name=$1 min=$2 max=$3 left=$((DEADLINE - SECONDS - 5)) code; shift 3
  [[ ",$PARTS," == *",$name,"* ]] || return 0
  if (( left < min )); then
    say "SKIPPED $name: ${left}s left, it needs ${min}s or more; run it in another call: bash bench/gpu_run.sh $name"
    return 0
  fi
  say "START $name (timeout $((left < max ? left : max))s)"
  timeout -k 10 $((left < max ? left : max)) "$@"
  code=$?
  say "END $name: exit $code$( ((code == 124 || code == 137)) && echo ' (timed out)')"
}

main() {
  say "parts: $PARTS; deadline ${DEADLINE}s; OUT=$OUT"
  if [[ -n ${BENCH_PYTHON:-} ]]; then PY=$BENCH_PYTHON
  elif (( ! SMOKE )); then PY=$GPU_PYTHON
  elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
  else PY=python3
  fi
  site=$GPU_SITE_DIR
  if (( SMOKE )) || [[ $ARCHIVE == none ]]; then site=$(mktemp -d); fi
  if [[ $ARCHIVE == none ]]; then  # site stays empty
    say "no archive: every package comes from $PY's environment"
  elif [[ ! -f $site/.unpacked ]]; then
    say "unpacking $ARCHIVE ($(du -h "$ARCHIVE" 2>/dev/null | cut -f1)) to $site"
    mkdir -p "$site" && tar -xJf "$ARCHIVE" -C "$site" && touch "$site/.unpacked" \
      || { say "no usable $ARCHIVE: run bash bench/gpu_site.sh first and carry it with the working tree"; exit 1; }
  fi
  if (( SMOKE )); then
    MODEL=(--smoke)
    say "smoke: $(find "$site" -name '*.dist-info' | wc -l) distributions unpacked; $($PY --version 2>&1) runs without them"
    rm -rf "$site"
  else
    NO_VLLM=${GPU_KIT_DIR:+$GPU_KIT_DIR:}$site:$PWD
    export PYTHONPATH=$NO_VLLM AGENTENV_NB_GPU_MODEL=$MODEL_DIR GPU_TORCH
    if [[ -f $GPU_VLLM_SITE_DIR/.unpacked ]]; then
      PYTHONPATH=${GPU_KIT_DIR:+$GPU_KIT_DIR:}$GPU_VLLM_SITE_DIR:$site:$PWD
      if found=$($PY -c 'import vllm; from vllm import LLM; print("vllm", vllm.__version__)' 2>&1); then
        say "vLLM on the path: $GPU_VLLM_SITE_DIR ($(tail -1 <<< "$found"))"
      else
        tail -20 <<< "$found"; say "vLLM is at $GPU_VLLM_SITE_DIR but doesn't import (above)"; exit 1
      fi
    else
      say "no vLLM at $GPU_VLLM_SITE_DIR: generating with transformers' generate (ship it: bench/gpu_vllm_site.sh)"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY - "$site" <<'EOF'
import importlib.metadata as md, os, pathlib, sys
from packaging.requirements import Requirement


def have(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


print(f"python {sys.version.split()[0]};", ", ".join(f"{n} {have(n)}" for n in ("torch", "transformers", "accelerate",
                                                                               "peft", "numpy", "typing_extensions")))
expected = os.environ.get("GPU_TORCH", "")
if expected and have("torch") != expected:
    print(f"WARNING: torch here is {have('torch')}, the machine description (GPU_TORCH) says {expected}: "
          "the archive's pins and bitsandbytes library were chosen for that one")
unmet = []
for info in sorted(pathlib.Path(sys.argv[1]).glob("*.dist-info")):
    dist = md.PathDistribution(info)
    for req in map(Requirement, dist.requires or []):
        applies = not req.marker or req.marker.evaluate({"extra": ""})
        if applies and not (have(req.name) and req.specifier.contains(have(req.name), prereleases=True)):
            unmet.append(f"{dist.metadata['Name']} wants {req} (here: {have(req.name) or 'none'})")
print(f"requirements of the carried distributions not met here ({len(unmet)}; the runs below tell which matter):")
print("\n".join(f"  {line}" for line in unmet))
EOF
    say "building the random Qwen3-4B-shaped model in $MODEL_DIR"
    timeout 240 $PY -c "import sys; from agentenv_nb.train.tiny import build_random_qwen3_4b as b
print(b(sys.argv[1], device='cuda'))" "$MODEL_DIR" || { say "could not build the model"; exit 1; }
    MODEL=(--model "$MODEL_DIR")
  fi
  NO_VLLM=${NO_VLLM:-${PYTHONPATH:-}}

  part grpo 200 430 $PY bench/gpu_grpo.py "${MODEL[@]}" --variants "${GRPO_VARIANTS:-kit,bare,trl}" \
    --budget-s "${GRPO_BUDGET_S:-150}" ${GRPO_ARGS:-}
  part generate 100 250 env PYTHONPATH="$NO_VLLM" $PY bench/gpu_grpo.py "${MODEL[@]}" --tag _generate \
    --variants "${GENERATE_VARIANTS:-bare}" --budget-s "${GRPO_BUDGET_S:-150}" ${GENERATE_ARGS:-}
  part sft 60 150 $PY bench/gpu_sft.py "${MODEL[@]}"
  part test 45 150 env PYTHONPATH="$NO_VLLM" $PY -m pytest tests/gpu -o addopts= -q -rs -p no:cacheprovider \
    --junitxml "$OUT/pytest.xml"
  part vllm-test 100 250 $PY -m pytest tests/gpu -o addopts= -q -rs -p no:cacheprovider \
    --junitxml "$OUT/pytest_vllm.xml"
  part 16bit 100 300 $PY bench/gpu_grpo.py "${MODEL[@]}" --preset 16bit --no-cap --variants "${GRPO16_VARIANTS:-kit}" \
    --budget-s "${GRPO_BUDGET_S:-150}"
  say "done; in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}

main 2>&1 | tee -a "$OUT/run.log"
