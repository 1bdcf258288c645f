# Sourced by the GPU bench scripts from the repository's root: reads the GPU machine's description, GPU_MACHINE_ENV
# (default bench/gpu_machine.env), into the calling script; MACHINE_ENV names the file it read.
MACHINE_ENV=${GPU_MACHINE_ENV:-bench/gpu_machine.env}
[[ $MACHINE_ENV == /* ]] || MACHINE_ENV=./$MACHINE_ENV  # `source` would look a bare name up on PATH
[[ -f $MACHINE_ENV ]] || { echo "${0##*/}: no machine description at $MACHINE_ENV" >&2; exit 2; }
# shellcheck source=gpu_machine.env
source "$MACHINE_ENV"
