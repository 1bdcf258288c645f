#!/usr/bin/env bash
# On the GPU machine, once bench/gpu_stack.py has installed the stack: the GPU runs of one session, in the background
# (setsid), so they outlast a run's 10 minutes, each under the deadline, logging to WORK (default /var/tmp/gpu-run).
#
#   setsid bash bench/gpu_session.sh DEADLINE_EPOCH_S > /var/tmp/gpu-run.log 2>&1 < /dev/null &
#   bash bench/gpu_session.sh --collect OUT     # later: the logs and summaries into OUT, one archive in parts of
#                                               # 15 MiB (the device returns files of 16 MiB at most): cat them
#
# Each on the one GPU held as its own card would be:
# - tests/gpu/test_notebooks.py for each of GPU_PRESETS ("24gb" held to 24 GB, "16bit" to 48 GB; empty: none; a word
#   "PRESET,NAME=VALUE,..." runs PRESET with those environment variables, in a folder of that name, e.g.
#   "24gb,AGENTENV_NB_VLLM_WEIGHTS=4bit" beside "24gb", the recipe's weights beside the card's choice) at once, on one
#   generated bundle (GPU_TRAIN_DAYS train days, 2,000 unless set, and GPU_EVAL_DAYS eval days, 200 unless set), each
#   in its own folder: the notebooks top to bottom with SmolLM2-135M-Instruct;
# - beside them, once "24gb"'s warm start is saved: the training command from it with each GRPO setting of
#   GPU_PROBES over the preset's (words of KEY=VALUE, several in a word apart by ",", e.g. "learning_rate=2e-4
#   temperature=0.7,lr_scheduler_type=constant"; empty: none), each in its own folder, for the eval curve and the
#   greedy eval of the 200 eval days after training against the notebook's;
# - beside them, bench/gpu_sft.py for each of GPU_SFT_PROBES (";" apart, each "TRAIN_DAYS [KEY=VALUE ...]", SFTConfig
#   settings over the preset's; empty: none), e.g. GPU_SFT_PROBES="400; 400 num_train_epochs=12; 1200": "24gb"'s whole
#   SFT of SmolLM2 on the first TRAIN_DAYS train days of one bundle of their own, scored greedily on its 200 eval days;
# - beside them, tests/gpu/test_async_grpo.py on the random Qwen3-4B shape (GPU_ASYNC_TEST=0: not run), and
#   tests/gpu/test_vllm_play.py, play on vLLM (from 4-bit weights, then from 16-bit with the LoRA folded in) against
#   transformers' generate with SmolLM2 (GPU_PLAY_TEST=0: not run);
# - with GPU_PATH_TEST=1, beside them, tests/gpu/test_gpu_path.py: a 4-bit GRPO step and an eval on that shape;
# - with GPU_SEEDS="1 2", each preset's notebooks on a bundle of each seed at once (WORK/PRESET, WORK/PRESET-seed2);
# - with GPU_TRIAL=1, beside them, bench/gpu_trial.py on the Qwen3-4B shape held to 24 GB (WORK/trial.json), each of
#   its runs (GPU_TRIAL_RUNS, "fits planted" unless set) stopped after GPU_TRIAL_TIMEOUT_S (600 unless set);
# - with GPU_EXPERT_REPLAY=1, first, bench/expert_replay.py: notebook 02's replay of 2,000 expert episodes;
# - once the notebooks are done, on the idle card: bench/gpu_grpo.py on the Qwen3-4B shape held to 24 GB, the variants
#   GPU_VARIANTS names, in order, as long as the deadline allows (GPU_VARIANTS= : none); runs of their own apart by
#   ";", each its variants and gpu_grpo.py's options (a --tag each: each run's report is grpo_24gb<tag>.json), e.g.
#   GPU_VARIANTS="bare,kit,kit-4bit; kit-async --budget-s 130 --tag _async; kit-fp8 --tag _fp8"
#   before them, with GPU_SFT_STEP=1, bench/gpu_sft.py's SFT step on that shape held to 24 GB, and before that, with
#   GPU_EXPERT_STEP=S, bench/expert_step.py: a tool-heavy step's env work (32 rollouts, 8 server processes) against a
#   step of S seconds.
# With GPU_SESSION=probes instead: notebook 02 alone on "24gb" (as the notebooks test runs it), then GPU_PROBES at once.
# With GPU_SESSION=scale instead, on a machine of two GPUs: bench/gpu_scale.py, the training command on one GPU and
# then on two under torchrun, each GPU held to 24 GB, the preset's vLLM on each rank (WORK/scale, WORK/scale.json).
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/var/tmp/gpu-run}
if [[ ${1:-} == --collect ]]; then
  tar -czf - -C "$(dirname "$WORK")" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' --exclude=state \
    --exclude='gridsim-gpu' --exclude='models' --exclude=q4b --exclude='*.gguf' --exclude='tokenizer*' "$(basename "$WORK")" |
    split -b 15M - "$2/gpu-run.tgz." && ls -la "$2"
  exit
fi
deadline=${1:?usage: gpu_session.sh DEADLINE_EPOCH_S | --collect OUT}
# GPU_STACK: the known set installed there (agentenv_nb.host.stacks; default cuda13, requirements-gpu.txt's), which the
# notebooks' set-up cell then finds installed (AGENTENV_NB_STACK)
export AGENTENV_NB_STACK=${GPU_STACK:-cuda13}
site=$(python3 bench/gpu_stack.py path --stack "$AGENTENV_NB_STACK") \
  || { echo "the stack is not installed: bench/gpu_stack.py receive first"; exit 1; }
mkdir -p "$WORK"
# The kit installed too, not only importable: its process sandbox is an agent_env plugin found by its entry point.
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$WORK/kit" . || exit 1
export PYTHONPATH=$PWD:$site:$WORK/kit PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
left() { echo $((deadline - $(date +%s))); }
say() { echo "[$(date +%T), $(left) s left] $*"; }
room() { (($(left) >= 80)) || { say "$1: not started, too close to the deadline"; return 1; }; }  # a load's time
python3 - <<'EOF'
import importlib.metadata as md, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print({n: version(n) for n in ("torch", "vllm", "vllm-bnb-plugin", "unsloth", "trl", "transformers", "bitsandbytes",
                               "triton", "nvidia-nccl-cu13", "nvidia-cudnn-cu13")})
print(torch.cuda.get_device_name(), "cuDNN", torch.backends.cudnn.version())
EOF
q4b() {  # the random Qwen3-4B shape, built on the GPU once, whichever run asks first
  (flock 9; [[ -f $WORK/q4b/config.json ]] || python3 -c \
    "import sys; from agentenv_nb.train.model.tiny import build_random_qwen3_4b as b; b(sys.argv[1], device='cuda')" \
    "$WORK/q4b" > "$WORK/q4b.log" 2>&1) 9> "$WORK/q4b.lock"
}
if [[ ${GPU_SESSION:-} == scale ]]; then  # one GPU, then two, in one table; each launch stopped in its half of the time
  q4b || { say "q4b: failed"; exit 1; }
  for gpus in 1 2; do
    OUT=$WORK timeout -k 30 $(($(left) - 30)) python3 bench/gpu_scale.py --model "$WORK/q4b" --gpus $gpus --steps 3 \
      --work "$WORK/scale" --timeout-s $(( gpus == 1 ? ($(left) - 60) / 2 : $(left) - 60 )) >> "$WORK/scale.log" 2>&1
    say "scale, $gpus GPU(s): exit $?"
  done
  exit
fi
seeds=(${GPU_SEEDS:-1})  # the bundles' seeds: seed 1's is gridsim-gpu, each other's gridsim-gpu-seedN
bundle_of() { [[ $1 == "${seeds[0]}" ]] && echo "$WORK/gridsim-gpu" || echo "$WORK/gridsim-gpu-seed$1"; }
for seed in "${seeds[@]}"; do
  python3 -m agentenv_nb.tasks.gridsim "$(bundle_of "$seed")" --train "${GPU_TRAIN_DAYS:-2000}" \
    --eval "${GPU_EVAL_DAYS:-200}" --seed "$seed" --overwrite
done

notebooks() {  # notebooks PRESET[,NAME=VALUE...] [SEED]: the four notebooks on PRESET with those environment
  local preset=${1%%,*} run=${1//[\/.]/_} vars=()  # variables (e.g. "16bit,UNSLOTH_VLLM_MERGED_ROLLOUT=0") on SEED's
  [[ $1 == *,* ]] && IFS=, read -ra vars <<< "${1#*,}"  # bundle, in WORK/RUN, RUN.log: RUN is the word, each "/" and
  [[ ${2:-${seeds[0]}} != "${seeds[0]}" ]] && run+=-seed$2  # "." a "_" (--collect leaves out *.gguf), -seedN past the
                                                            # first seed
  mkdir -p "$WORK/$run"
  env "${vars[@]}" GPU_NOTEBOOKS_OUT="$WORK/$run" AGENTENV_NB_PRESET="$preset" \
    AGENTENV_NB_BUNDLE="$(bundle_of "${2:-${seeds[0]}}")" \
    timeout -k 10 "$(left)" python3 -m pytest tests/gpu/test_notebooks.py -o addopts= -q -s -p no:cacheprovider \
    > "$WORK/$run.log" 2>&1
  say "notebooks $1: exit $?"
}
probes() {  # GRPO from the "24gb" notebooks' warm start with each setting of GPU_PROBES
  local warm=$WORK/24gb/run/sft/merged sets
  until [[ -f $WORK/24gb/02_sft_warm_start.ipynb ]] || (($(left) < 400)); do sleep 10; done  # notebook 02 done
  [[ -f $warm/config.json ]] || { say "probes: no warm start"; return; }
  for setting in $GPU_PROBES; do
    IFS=, read -ra sets <<< "$setting"
    AGENTENV_NB_GPU_MEMORY_GB=24 AGENTENV_NB_LIBRARY_LOG=$WORK/$setting.library.log timeout -k 10 "$(left)" \
      python3 -m agentenv_nb.train --bundle "$WORK/gridsim-gpu" --warm-start "$warm" --run-dir "$WORK/$setting" \
      --preset 24gb --sandbox process --server-processes 4 --gguf '' --eval-days 200 "${sets[@]/#/--set=}" \
      > "$WORK/$setting.log" 2>&1 &
  done
  wait
  say "probes: done"
}
sft_probes() {
  local probes probe days settings setting sets most=0 n=0 model
  IFS=';' read -ra probes <<< "$GPU_SFT_PROBES"
  for probe in "${probes[@]}"; do read -r days _ <<< "$probe"; ((days > most)) && most=$days; done
  python3 -m agentenv_nb.tasks.gridsim "$WORK/gridsim-probe" --train "$most" --eval 200 --overwrite > /dev/null
  model=$(python3 -c 'from tests.conftest import smollm2_gguf; print(smollm2_gguf())')
  for probe in "${probes[@]}"; do
    read -r days settings <<< "$probe"
    n=$((n + 1)) sets=()
    for setting in $settings; do sets+=(--set "$setting"); done
    OUT=$WORK AGENTENV_NB_GPU_MEMORY_GB=24 AGENTENV_NB_LIBRARY_LOG=$WORK/sft_$n.library.log timeout -k 10 "$(left)" \
      python3 bench/gpu_sft.py --model "$model" --bundle "$WORK/gridsim-probe" --demos "$days" --steps -1 \
      --budget-s 0 --eval-days 200 --tag "_$n" "${sets[@]}" > "$WORK/sft_$n.log" 2>&1 &
    sleep 20  # each one's vLLM sized apart
  done
  wait
  say "sft probes: done"
}
async_test() {
  q4b && AGENTENV_NB_GPU_MODEL=$WORK/q4b timeout -k 10 "$(left)" python3 -m pytest tests/gpu/test_async_grpo.py -o addopts= \
      -q -p no:cacheprovider > "$WORK/async_test.log" 2>&1
  say "async test: exit $?"
}
path_test() {
  q4b && AGENTENV_NB_GPU_MODEL=$WORK/q4b timeout -k 10 "$(left)" python3 -m pytest tests/gpu/test_gpu_path.py \
      -o addopts= -q -p no:cacheprovider > "$WORK/path_test.log" 2>&1
  say "path test: exit $?"
}
play_test() {  # one vLLM engine a process: from 4-bit weights ("24gb"), then from 16-bit ("16bit", the LoRA folded in)
  local preset
  for preset in 24gb 16bit; do
    room "play test, $preset" || return
    timeout -k 10 "$(left)" python3 -m pytest tests/gpu/test_vllm_play.py -k "$preset" -o addopts= -q -s \
      -p no:cacheprovider > "$WORK/play_test_$preset.log" 2>&1
    say "play test, $preset: exit $?"
  done
}
trial() {  # bench/gpu_trial.py: the trial step's estimate against its run's steps on the Qwen3-4B shape, then a
  q4b && OUT=$WORK timeout -k 10 "$(left)" python3 bench/gpu_trial.py --model "$WORK/q4b" \
    --bundle "$WORK/gridsim-gpu" --work "$WORK/trial" --timeout-s "${GPU_TRIAL_TIMEOUT_S:-600}" \
    --runs ${GPU_TRIAL_RUNS:-fits planted} > "$WORK/trial.log" 2>&1  # planted run that can't fit
  say "trial: exit $?"
}
if [[ ${GPU_SESSION:-} == probes ]]; then
  mkdir -p "$WORK/24gb"
  AGENTENV_NB_PRESET=24gb AGENTENV_NB_BUNDLE=$WORK/gridsim-gpu timeout -k 10 "$(left)" python3 -c \
    'import sys, pathlib, tests.gpu.test_notebooks as t; t.run_warm_start(pathlib.Path(sys.argv[1]))' "$WORK/24gb" \
    > "$WORK/24gb.log" 2>&1
  say "notebook 02: exit $?"
  probes
  exit
fi
if [[ ${GPU_EXPERT_REPLAY:-0} == 1 ]]; then
  timeout -k 10 300 python3 bench/expert_replay.py --episodes 2000 --server-processes 8 --lanes 32 \
    > "$WORK/expert_replay.json" 2> "$WORK/expert_replay.log"
  say "expert replay: exit $? $(cat "$WORK/expert_replay.json")"
fi
runs=()
for preset in ${GPU_PRESETS-24gb 16bit}; do  # GPU_PRESETS= : none
  for seed in "${seeds[@]}"; do
    notebooks "$preset" "$seed" & runs+=($!)
    sleep 20  # each kernel's model loaded apart
  done
done
[[ ${GPU_TRIAL:-0} == 1 ]] && { trial & }
[[ -n ${GPU_PROBES:-} ]] && { probes & }
[[ -n ${GPU_SFT_PROBES:-} ]] && { sft_probes & }
[[ ${GPU_ASYNC_TEST:-1} == 1 ]] && { async_test & }
[[ ${GPU_PLAY_TEST:-1} == 1 ]] && { play_test & }
[[ ${GPU_PATH_TEST:-0} == 1 ]] && { path_test & }
wait "${runs[@]}"
say "notebooks done"
wait  # the probes and the async, play and path tests, which would share the card
if [[ -n ${GPU_EXPERT_STEP:-} ]] && room "expert step"; then  # CPU work: first, while nothing else runs on the host
  timeout -k 10 $(($(left) - 20)) python3 bench/expert_step.py --rollouts 32 --batch 32 --server-processes 8 --steps 4 \
    --step-s "$GPU_EXPERT_STEP" > "$WORK/expert_step.log" 2>&1
  say "expert step: exit $?"
fi
grpo=${GPU_VARIANTS-bare,kit,kit-4bit}
[[ -n $grpo || ${GPU_SFT_STEP:-0} == 1 ]] || { say done; exit; }
q4b
if [[ ${GPU_SFT_STEP:-0} == 1 ]] && room "sft step"; then
  OUT=$WORK timeout -k 10 $(($(left) - 20)) python3 bench/gpu_sft.py --model "$WORK/q4b" > "$WORK/sft_step.log" 2>&1
  say "sft step: exit $?"
fi
IFS=';' read -ra grpo_runs <<< "$grpo"
for run in "${grpo_runs[@]}"; do  # "VARIANTS [gpu_grpo.py's options]", e.g. "kit-16bit --load KEY=VALUE --tag _kv"
  read -r variants options <<< "$run"
  room "grpo $run" || break
  # shellcheck disable=SC2086  # the run's options, split as written
  OUT=$WORK timeout -k 10 $(($(left) - 20)) python3 bench/gpu_grpo.py --model "$WORK/q4b" --variants "$variants" \
    --budget-s "${GPU_VARIANT_BUDGET_S:-60}" $options >> "$WORK/grpo.log" 2>&1
  say "grpo $run: exit $?"
done
say done
