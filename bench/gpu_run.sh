#!/usr/bin/env bash
# The GPU proof in ONE device run (the `run` tool: <= 600 s, carry [".gpu/site.tar.xz"]). Unpacks the archive that
# bench/gpu_site.sh made here to /var/tmp/gpu-site, not /tmp: as root, the process sandbox gives each env process a
# /tmp of its own, where a site folder under /tmp is gone. Puts it and the repo on PYTHONPATH, builds the random
# Qwen3-4B-shaped model once in /tmp/q4b, then runs the parts, most important first, each under `timeout`, within a
# deadline:
#
#   grpo   bench/gpu_grpo.py: the kit, bare Unsloth, plain TRL; 4-bit, GPU held to 24 GB  -> $OUT/grpo_24gb.json
#   sft    bench/gpu_sft.py: notebook 02's SFT, 4-bit, 24 GB                               -> $OUT/sft_24gb.json
#   test   pytest tests/gpu: a 4-bit GRPO step through AgentEnv whose rollouts call tools  -> $OUT/pytest.xml
#   16bit  optional: bench/gpu_grpo.py --preset 16bit --no-cap (GRPO16_VARIANTS: kit) -> $OUT/grpo_16bit_nocap.json
#
# A part that no longer fits before the deadline is skipped, saying so (run it in a later call). Everything printed
# also goes to $OUT/run.log. The site folder and /tmp/q4b are reused when a warm machine still has them.
#
# Usage: bash bench/gpu_run.sh [PARTS] [--smoke]     PARTS: comma-separated, default grpo,sft,test (add 16bit)
#   DEADLINE_S (585): seconds for the whole run; GRPO_BUDGET_S (150): training seconds a GRPO variant may take;
#   GRPO_VARIANTS (kit,bare,trl): the grpo part's variants; GRPO_ARGS: more options of gpu_grpo.py for it
#   (e.g. "--set steps_per_generation=1").
#   --smoke: the same parts on this CPU with /work/venv (tiny model, cpu-tiny; the site archive only unpacked).
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=grpo,sft,test SMOKE=0
for arg in "$@"; do case $arg in --smoke) SMOKE=1 ;; *) PARTS=$arg ;; esac; done
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
  site=/var/tmp/gpu-site
  (( SMOKE )) && site=$(mktemp -d)
  if [[ ! -f $site/.unpacked ]]; then
    say "unpacking .gpu/site.tar.xz ($(du -h .gpu/site.tar.xz 2>/dev/null | cut -f1)) to $site"
    mkdir -p "$site" && tar -xJf .gpu/site.tar.xz -C "$site" && touch "$site/.unpacked" \
      || { say "no usable .gpu/site.tar.xz: run bash bench/gpu_site.sh first and carry .gpu"; exit 1; }
  fi
  if (( SMOKE )); then
    PY=${VENV_PY:-/work/venv/bin/python}
    MODEL=(--smoke)
    say "smoke: $(find "$site" -name '*.dist-info' | wc -l) distributions unpacked; $($PY --version) runs without them"
    rm -rf "$site"
  else
    PY=python3
    export PYTHONPATH=$site:$PWD AGENTENV_NB_GPU_MODEL=/tmp/q4b
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY - "$site" <<'EOF'
import importlib.metadata as md, pathlib, sys
from packaging.requirements import Requirement


def have(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


print(f"python {sys.version.split()[0]};", ", ".join(f"{n} {have(n)}" for n in ("torch", "transformers", "accelerate",
                                                                               "peft", "numpy", "typing_extensions")))
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
    say "building the random Qwen3-4B-shaped model in /tmp/q4b"
    timeout 240 $PY -c "from agentenv_nb.tiny import build_random_qwen3_4b as b; print(b('/tmp/q4b', device='cuda'))" \
      || { say "could not build the model"; exit 1; }
    MODEL=(--model /tmp/q4b)
  fi

  part grpo 200 430 $PY bench/gpu_grpo.py "${MODEL[@]}" --variants "${GRPO_VARIANTS:-kit,bare,trl}" \
    --budget-s "${GRPO_BUDGET_S:-150}" ${GRPO_ARGS:-}
  part sft 60 150 $PY bench/gpu_sft.py "${MODEL[@]}"
  part test 45 150 $PY -m pytest tests/gpu -o addopts= -q -rs -p no:cacheprovider --junitxml "$OUT/pytest.xml"
  part 16bit 100 300 $PY bench/gpu_grpo.py "${MODEL[@]}" --preset 16bit --no-cap --variants "${GRPO16_VARIANTS:-kit}" \
    --budget-s "${GRPO_BUDGET_S:-150}"
  say "done; in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}

main 2>&1 | tee -a "$OUT/run.log"
