#!/usr/bin/env bash
# Gather what the GPU machine lacks for the kit's GPU path (the trainer stack and the env stack) as wheels for its
# Python and architecture, at the local environment's versions, into ONE slimmed site folder packed as
# WORK/site.tar.xz (.gpu/site.tar.xz by default), small enough to travel with the repo in one run on the machine.
# bench/gpu_run.sh unpacks it there. What this assumes about the GPU machine (its Python, the packages it already
# has, its torch and CUDA, version pins, the size limit) is in bench/gpu_machine.env; see docs/benchmarks.md.
#
# Carried: every distribution whose modules the kit's path imports (traced here, below) and the GPU-only ones
# (CARRY_GPU), less what the machine already has (GPU_KEEP) and what is only imported inside a try/except
# (OPTIONAL). Wheels are cached in WORK/wheels; the site folder and archive are rebuilt only when the wheel set,
# this script, the machine description or pyproject.toml changed. agentenv_nb travels with the working tree; its
# entry point (the "process" sandbox) gets a dist-info in the site folder.
#
# Checked here: the traced closure (the CPU smokes of bench/gpu_grpo.py and bench/gpu_sft.py, with the TRL
# subprocess and the env processes; cached in WORK/closure.txt, --retrace refreshes it) is all in the archive or on
# the machine; the archive unpacks; its extension modules are listed and, with a local Python of the machine's
# version, imported, save those that need torch or CUDA, which only the GPU machine can import.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bash bench/gpu_site.sh [OPTIONS]

Build the site archive (WORK/site.tar.xz) that bench/gpu_run.sh unpacks on the GPU machine.
Needs the kit's environment (bash .ci/setup) and pip access to PyPI.

Options (each has an environment variable; a flag wins over it):
  --retrace              trace the kit's imports again (else WORK/closure.txt is reused)
  --python PY            Python of the kit's environment: it runs the trace, and its versions are carried
                         [BENCH_PYTHON; default .venv/bin/python if present, else python3]
  --check-python PY      a local Python of the GPU machine's version, to import the archive's extension modules
                         [CHECK_PYTHON; default python$GPU_PYTHON_VERSION (python3.12) on PATH, else skipped]
  --no-import-check      skip that import check (CHECK_PYTHON=none does the same)
  --packages FILE        list of the packages the GPU machine has, to check the archive against
                         [GPU_PACKAGES_FILE; default none: GPU_KEEP is taken on trust]
  --work-dir DIR         cache of wheels, trace, site folder and archive [GPU_SITE_WORK; default .gpu]
  --machine-env FILE     the GPU machine's description [GPU_MACHINE_ENV; default bench/gpu_machine.env]
  -h, --help             print this and exit

Relative paths are taken from the repository root. The machine's description (GPU_KEEP, GPU_PINS, GPU_TORCH,
GPU_PYTHON_VERSION, GPU_CARRY_LIMIT_MIB, ...) is read from the --machine-env file; a variable set in the
environment overrides it. See docs/benchmarks.md, "Running the GPU benchmarks".
EOF
}

RETRACE=0
while (( $# )); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --retrace) RETRACE=1 ;;
    --no-import-check) CHECK_PYTHON=none ;;
    --python|--check-python|--packages|--work-dir|--machine-env)
      (( $# >= 2 )) || { echo "gpu_site.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --python) BENCH_PYTHON=$2 ;;
        --check-python) CHECK_PYTHON=$2 ;;
        --packages) GPU_PACKAGES_FILE=$2 ;;
        --work-dir) GPU_SITE_WORK=$2 ;;
        --machine-env) GPU_MACHINE_ENV=$2 ;;
      esac
      shift ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    *) echo "gpu_site.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
source bench/load_machine.sh  # the GPU machine's description: MACHINE_ENV
export GPU_KEEP GPU_PINS GPU_PACKAGES_FILE
if [[ -z ${BENCH_PYTHON:-} ]]; then
  if [[ -x .venv/bin/python ]]; then BENCH_PYTHON=.venv/bin/python; else BENCH_PYTHON=python3; fi
fi
PY=$BENCH_PYTHON
command -v "$PY" >/dev/null || { echo "gpu_site.sh: no Python '$PY' (make the environment: bash .ci/setup)" >&2; exit 2; }
PYTAG=${GPU_PYTHON_VERSION//./}   # 3.12 -> 312
if [[ -z ${CHECK_PYTHON:-} ]]; then CHECK_PYTHON=$(command -v "python$GPU_PYTHON_VERSION" || true); fi
export GPU_SITE_WORK=${GPU_SITE_WORK:-.gpu}
G=${GPU_SITE_WORK%/}
mkdir -p "$G/wheels"
# The cache must not travel with the working tree: ignore it where .gitignore doesn't already (check-ignore says 1
# for a path in the repository that nothing ignores).
ignored=0; git check-ignore -q "$G/wheels" 2>/dev/null || ignored=$?
if (( ignored == 1 )); then
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")" && echo "/${G#./}/" >> "$exclude"
fi
echo "python: $PY ($("$PY" --version 2>&1)); work dir: $G;" \
  "machine: $MACHINE_ENV (Python $GPU_PYTHON_VERSION $GPU_ARCH, torch $GPU_TORCH)"

# Imported only inside try/except ImportError: gradio's IPython magic; xformers, Unsloth's optional kernels (the
# local one is built for the local torch, which need not be the GPU machine's).
export OPTIONAL="ipython traitlets xformers"
# Imported on a GPU only (Unsloth's CUDA path), so the CPU trace can't see them all; seen importing there. a2a-sdk's
# gRPC code imports google.api (googleapis-common-protos), which the GPU machine lacks too.
export CARRY_GPU="trl unsloth unsloth-zoo bitsandbytes datasets peft cut-cross-entropy torchao tyro docstring-parser
 typeguard json5 nest-asyncio structlog msgspec dill multiprocess googleapis-common-protos"

helper() {  # the Python parts: specs | missing | distinfo | verify
  "$PY" - "$@" <<'EOF'
import glob, os, re, sys, tomllib, importlib.metadata as md
from packaging.version import Version
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
words = lambda var: {norm(w) for w in os.environ[var].split()}
G, what = os.environ["GPU_SITE_WORK"], sys.argv[1]
closure = {norm(n) for n in open(f"{G}/closure.txt").read().split()}
pins = {norm(name): version for name, version in (p.split("==") for p in os.environ["GPU_PINS"].split())}

def wheels():  # {wheel file: (normalized name, version)} of the cached wheels
    return {w: (norm(os.path.basename(w).split("-")[0]), Version(os.path.basename(w).split("-")[1]))
            for w in glob.glob(f"{G}/wheels/*.whl")}

def machine_has():  # the names GPU_PACKAGES_FILE lists (None: no list): after its last "Packages:", if any
    path = os.environ.get("GPU_PACKAGES_FILE", "")
    if not path:
        return None
    if not os.path.isfile(path):
        print(f"no package list at {path}: checking against GPU_KEEP alone")
        return None
    text = "\n".join(line.split("#")[0] for line in open(path).read().splitlines())
    return {norm(n.strip(" .`'\"")) for n in re.split(r"[,\s]+", text.split("Packages:")[-1]) if n.strip(" .`'\"")}

if what == "specs":
    for name in sorted((closure | words("CARRY_GPU")) - words("GPU_KEEP") - words("OPTIONAL") - {"agentenv-nb"}):
        version = pins.get(name) or md.version(name)
        print(f"{name}=={version}")
elif what in ("missing", "stale"):  # specs with no wheel yet; wheels no spec names (one version of each)
    specs = {(norm(s.split("==")[0]), Version(s.split("==")[1])): s for s in sys.argv[2:]}
    have = set(wheels().values())
    if what == "missing":
        print(" ".join(spec for key, spec in sorted(specs.items()) if key not in have))
    else:
        print(" ".join(w for w, key in wheels().items() if key not in specs))
elif what == "distinfo":  # agentenv_nb's entry points, so agent_env finds the "process" sandbox provider
    project = tomllib.load(open("pyproject.toml", "rb"))["project"]
    folder = f"{sys.argv[2]}/agentenv_nb-{project['version']}.dist-info"
    os.makedirs(folder, exist_ok=True)
    open(f"{folder}/METADATA", "w").write(f"Metadata-Version: 2.1\nName: agentenv-nb\nVersion: {project['version']}\n")
    open(f"{folder}/entry_points.txt", "w").write("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
        for group, points in project.get("entry-points", {}).items()))
elif what == "verify":  # every traced distribution is in the archive, on the machine, or optional
    carried = {norm(os.path.basename(d).split("-")[0]) for d in glob.glob(f"{sys.argv[2]}/*.dist-info")}
    listed = machine_has()
    machine = words("GPU_KEEP") if listed is None else listed
    lacking = sorted(closure - carried - machine - words("OPTIONAL") - {"agentenv-nb"})
    print(f"closure: {len(closure)} distributions; {len(closure & carried)} carried, "
          f"{len((closure - carried) & machine)} on the GPU machine"
          f"{' (GPU_KEEP, not checked against a package list)' if listed is None else ''}, "
          f"{len(closure & words('OPTIONAL'))} optional")
    if listed is not None:
        kept_but_absent = sorted((words("GPU_KEEP") & closure) - listed)
        if kept_but_absent:
            print("GPU_KEEP names the package list doesn't:", " ".join(kept_but_absent))
    if lacking:
        sys.exit("MISSING from the archive and the GPU machine: " + " ".join(lacking))
    print("every traced distribution is carried or on the GPU machine")
EOF
}

trace() {  # run the CPU smokes under a module tracer; the distributions they imported go to WORK/closure.txt
  local dir; dir=$(mktemp -d)
  cat > "$dir/sitecustomize.py" <<'EOF'
import os, sys, threading, time
def _dump():  # every process (the TRL subprocess, the env processes and their forks) dumps its modules' files
    while True:
        try:
            names = sorted({f for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))})
            with open(os.path.join(os.environ["GPU_SITE_TRACE"], f"{os.getpid()}.txt"), "w") as out:
                out.write("\n".join(names))
        except Exception:
            pass
        time.sleep(0.5)
threading.Thread(target=_dump, daemon=True).start()
os.register_at_fork(after_in_child=lambda: threading.Thread(target=_dump, daemon=True).start())
EOF
  mkdir -p "$dir/mods"
  for script in bench/gpu_grpo.py bench/gpu_sft.py; do
    echo "tracing $script --smoke ..."
    GPU_SITE_TRACE="$dir/mods" PYTHONPATH="$dir:$PWD" OUT="$dir/out" timeout 900 "$PY" "$script" --smoke \
      > "$dir/log" 2>&1 || { tail -30 "$dir/log"; echo "trace: $script --smoke failed"; exit 1; }
  done
  sleep 1
  "$PY" - "$dir/mods" > "$G/closure.txt" <<'EOF'
import glob, sys, sysconfig, importlib.metadata as md
site = sysconfig.get_paths()["purelib"] + "/"
files = set()
for path in glob.glob(sys.argv[1] + "/*.txt"):
    files |= set(open(path).read().split("\n"))
owner = {site + str(f): d.metadata["Name"] for d in md.distributions(path=[site]) for f in d.files or []}
print("\n".join(sorted({owner[f] for f in files if f in owner}, key=str.lower)))
EOF
  rm -rf "$dir"
}
if (( RETRACE )) || [[ ! -s $G/closure.txt ]]; then trace; fi

read -r -a SPECS <<< "$(helper specs | tr '\n' ' ')"
read -r -a MISSING <<< "$(helper missing "${SPECS[@]}")"
if (( ${#MISSING[@]} )); then
  echo "downloading ${#MISSING[@]} wheels for Python $GPU_PYTHON_VERSION on $GPU_ARCH..."
  platforms=(); for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_${GPU_ARCH}"); done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON_VERSION" --implementation cp \
    "${platforms[@]}" --platform "manylinux2014_${GPU_ARCH}" --platform "manylinux1_${GPU_ARCH}" -d "$G/wheels" \
    "${MISSING[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
for w in $(helper stale "${SPECS[@]}"); do echo "dropping stale $(basename "$w")"; rm "$w"; done

stamp=$( (ls "$G/wheels"; cat "$0" "$MACHINE_ENV" pyproject.toml
          echo "$GPU_KEEP $GPU_PINS $GPU_CUDA_TAG $GPU_PYTHON_VERSION $GPU_ARCH") | sha256sum | cut -c1-16)
if [[ -s $G/site.tar.xz && "$(cat "$G/stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "archive up to date"
else
  rm -rf "$G/site" && mkdir -p "$G/site"
  "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
    "$G/site" "$G"/wheels/*.whl
  for d in "$G"/site/*.data; do  # a wheel's .data/purelib and platlib belong in the site folder itself
    [[ -d $d ]] || continue
    for sub in purelib platlib; do [[ -d $d/$sub ]] && cp -r "$d/$sub/." "$G/site/"; done; rm -rf "$d"
  done
  du -sm "$G/site" | awk '{print "site before slimming: " $1 " MiB"}'
  rm -rf "$G/site/studio" "$G/site/unsloth/studio" "$G/site/test" "$G/site/tests" \
    "$G/site/gradio/templates" "$G/site/gradio/_frontend_code"
  # bitsandbytes ships one library per CUDA version: keep the GPU machine's alone
  [[ -d $G/site/bitsandbytes ]] && find "$G/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name "*${GPU_CUDA_TAG}*" -delete
  find "$G/site" -depth -type d \( -name __pycache__ -o -name tests -o -name test -o -name docs \) -exec rm -rf {} +
  find "$G/site" -name '*.pyi' -delete
  helper distinfo "$G/site"
  du -sm "$G/site" | awk '{print "site after slimming:  " $1 " MiB"}'
  tar -C "$G/site" -cf - . | xz -T0 -6 > "$G/site.tar.xz.part" && mv "$G/site.tar.xz.part" "$G/site.tar.xz"
  echo "$stamp" > "$G/stamp"
fi

helper verify "$G/site"
probe=$(mktemp -d); tar -xJf "$G/site.tar.xz" -C "$probe"
echo "archive unpacks: $(find "$probe" -type f | wc -l) files, same as the site folder: $(find "$G/site" -type f | wc -l)"
rm -rf "$probe"
echo "extension modules (by top-level package):"
find "$G/site" -name '*.so' -printf '%P\n' | cut -d/ -f1 | sort | uniq -c \
  | awk '{printf "  %s (%s)", $2, $1} END {print ""}'
# The ones that import without torch or CUDA, on a local Python of the GPU machine's version and architecture.
if [[ $CHECK_PYTHON == none ]]; then
  echo "import check skipped (--no-import-check)"
elif [[ -z $CHECK_PYTHON ]]; then
  echo "import check skipped: no python$GPU_PYTHON_VERSION on PATH (give one with --check-python or CHECK_PYTHON)"
elif [[ $(uname -m) != "$GPU_ARCH" ]]; then
  echo "import check skipped: this machine is $(uname -m), the archive's extension modules are $GPU_ARCH"
elif ! "$CHECK_PYTHON" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$GPU_PYTHON_VERSION')" \
    >/dev/null 2>&1; then
  echo "import check skipped: $CHECK_PYTHON does not run as Python $GPU_PYTHON_VERSION (give one with --check-python)"
else
  tops=$(find "$G/site" -name "*.cpython-${PYTAG}-*.so" -o -name '*.abi3.so' | sed "s|^$G/site/||" | cut -d/ -f1 \
    | sed 's/\..*//' | sort -u | grep -v -x -E 'bitsandbytes|torchao' || true)
  PYTHONPATH=$G/site "$CHECK_PYTHON" - $tops <<'EOF'
import importlib, sys
bad = []
for top in sys.argv[1:]:
    try:
        importlib.import_module(top)
    except Exception as e:
        bad.append(f"{top} ({type(e).__name__}: {e})")
tops = sys.argv[1:]
print(f"Python {sys.version.split()[0]} imports {len(tops) - len(bad)} of {len(tops)}:", " ".join(tops))
if bad:
    sys.exit("failed: " + "; ".join(bad))
EOF
  echo "  bitsandbytes, torchao: need torch with CUDA, imported only on the GPU machine"
fi

# What travels in one run: the working tree (tracked and untracked-not-ignored files) and the archive.
archive=$(stat -c %s "$G/site.tar.xz")
if git rev-parse --git-dir >/dev/null 2>&1; then
  tree=$( (git ls-files; git ls-files -o --exclude-standard) | sort -u \
    | while read -r f; do [[ -f $f ]] && stat -c %s "$f"; done \
    | awk '{s += $1} END {print s + 0}')
else
  tree=0; echo "not a git checkout: the working tree's size is not counted"
fi
awk -v a="$archive" -v t="$tree" -v name="$G/site.tar.xz" -v limit="$GPU_CARRY_LIMIT_MIB" \
    -v alimit="$GPU_ARCHIVE_LIMIT_MIB" 'BEGIN {
  printf "archive %s: %.1f MiB (at most %d); working tree that travels: %.1f MiB; together %.1f MiB of %d\n",
    name, a / 2^20, alimit, t / 2^20, (a + t) / 2^20, limit
  if (a > alimit * 2^20 || a + t > limit * 2^20) { print "TOO BIG"; exit 1 } }'
