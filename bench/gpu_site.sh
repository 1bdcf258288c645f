#!/usr/bin/env bash
# Gather what the H200 device machine lacks for the kit's GPU path (the trainer stack and the env stack) as
# Python 3.12 manylinux x86_64 wheels, at /work/venv's versions, into ONE slimmed site folder packed as
# .gpu/site.tar.xz, small enough to travel with the repo in one device run (64 MiB a call): carry
# [".gpu/site.tar.xz"], the archive alone, not .gpu (its wheels and site folder are this machine's cache).
#
# Usage: bash bench/gpu_site.sh [--retrace]
#
#   On the device (bench/gpu_run.sh does it): mkdir -p /var/tmp/gpu-site && tar -xJf .gpu/site.tar.xz -C
#   /var/tmp/gpu-site && export PYTHONPATH=/var/tmp/gpu-site:$PWD   (not under /tmp: env processes get their own /tmp)
#
# Carried: every distribution whose modules the kit's path imports (traced here, below) and the GPU-only ones
# (CARRY_GPU), less what the device's image keeps (KEEP_DEVICE: torch, what is compiled against it or pinned beside
# it, transformers and its hub stack) and what is only imported inside a try/except (OPTIONAL). Wheels are cached in
# .gpu/wheels; the site folder and archive are rebuilt only when the wheel set or this script changed. agentenv_nb
# travels with the working tree; its entry point (the "process" sandbox) gets a dist-info in the site folder.
#
# Checked here: the traced closure (the CPU smokes of bench/gpu_grpo.py and bench/gpu_sft.py, with the TRL subprocess
# and the env processes; cached in .gpu/closure.txt, --retrace refreshes it) is all in the archive or on the device;
# the archive unpacks; its cp312 extension modules are listed and, with a Python 3.12 (PY312, else pyenv's), imported,
# save those that need torch or CUDA, which only the device can import.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV_PY:-/work/venv/bin/python}
PY312=${PY312:-$(ls /root/.pyenv/versions/3.12*/bin/python3 2>/dev/null | head -1 || true)}
export KINDS=${KINDS:-/work/.library/device/KINDS.md}
G=.gpu
mkdir -p $G/wheels
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

# The device's own copies stay: torch and what is compiled against it or pinned beside it there.
export KEEP_DEVICE="torch triton numpy pandas pyarrow transformers tokenizers safetensors huggingface-hub hf-xet
 accelerate sentencepiece regex pyyaml markupsafe jinja2 psutil pillow sympy mpmath networkx filelock fsspec setuptools
 packaging xxhash aiohttp multidict yarl frozenlist propcache aiohappyeyeballs aiosignal charset-normalizer protobuf
 python-dateutil tzdata six tqdm requests urllib3 certifi idna einops"
# Imported only inside try/except ImportError: gradio's IPython magic; xformers, Unsloth's optional kernels (the
# venv's is built for torch 2.13, not the device's 2.11).
export OPTIONAL="ipython traitlets xformers"
# Imported on a GPU only (Unsloth's CUDA path), so the CPU trace can't see them all; seen importing there.
export CARRY_GPU="trl unsloth unsloth-zoo bitsandbytes datasets peft cut-cross-entropy torchao tyro docstring-parser
 typeguard json5 nest-asyncio structlog msgspec dill multiprocess"
# Versions other than /work/venv's: its torchao 0.18 is built for torch 2.13; 0.17.0 is the one seen working on 2.11.
export PINS="torchao==0.17.0"

helper() {  # the Python parts: specs | missing | distinfo | verify
  "$PY" - "$@" <<'EOF'
import glob, os, re, sys, tomllib, importlib.metadata as md
from packaging.version import Version
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
words = lambda var: {norm(w) for w in os.environ[var].split()}
G, what = ".gpu", sys.argv[1]
closure = {norm(n) for n in open(f"{G}/closure.txt").read().split()}
pins = dict(p.split("==") for p in os.environ["PINS"].split())

def wheels():  # {wheel file: (normalized name, version)} of the cached wheels
    return {w: (norm(os.path.basename(w).split("-")[0]), Version(os.path.basename(w).split("-")[1]))
            for w in glob.glob(f"{G}/wheels/*.whl")}

def device_has():  # the names KINDS.md lists under "Python packages already there"
    text = open(os.environ["KINDS"]).read() if os.path.exists(os.environ["KINDS"]) else ""
    listed = text.split("## Python packages already there")[-1].split("Packages:")[-1] if text else ""
    return {norm(n.strip(" .\n")) for n in listed.split(",") if n.strip()}

if what == "specs":
    for name in sorted((closure | words("CARRY_GPU")) - words("KEEP_DEVICE") - words("OPTIONAL") - {"agentenv-nb"}):
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
elif what == "verify":  # every traced distribution is in the archive, on the device, or optional
    carried = {norm(os.path.basename(d).split("-")[0]) for d in glob.glob(f"{sys.argv[2]}/*.dist-info")}
    device = device_has()
    lacking = sorted(closure - carried - device - words("OPTIONAL") - {"agentenv-nb"})
    kept_but_absent = sorted((words("KEEP_DEVICE") & closure) - device) if device else []
    print(f"closure: {len(closure)} distributions; {len(closure & carried)} carried, "
          f"{len((closure - carried) & device)} on the device, {len(closure & words('OPTIONAL'))} optional")
    if kept_but_absent:
        print("KEEP_DEVICE names KINDS.md doesn't list:", " ".join(kept_but_absent))
    if lacking:
        sys.exit("MISSING from the archive and the device: " + " ".join(lacking))
    print("every traced distribution is carried or on the device")
EOF
}

trace() {  # run the CPU smokes under a module tracer; the distributions they imported go to .gpu/closure.txt
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
  "$PY" - "$dir/mods" > $G/closure.txt <<'EOF'
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
if [[ "${1:-}" == --retrace || ! -s $G/closure.txt ]]; then trace; fi

read -r -a SPECS <<< "$(helper specs | tr '\n' ' ')"
read -r -a MISSING <<< "$(helper missing "${SPECS[@]}")"
if (( ${#MISSING[@]} )); then
  echo "downloading ${#MISSING[@]} wheels..."
  platforms=(); for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $G/wheels "${MISSING[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
for w in $(helper stale "${SPECS[@]}"); do echo "dropping stale $(basename "$w")"; rm "$w"; done

stamp=$( (ls $G/wheels; cat "$0" pyproject.toml) | sha256sum | cut -c1-16)
if [[ -s $G/site.tar.xz && "$(cat $G/stamp 2>/dev/null)" == "$stamp" ]]; then
  echo "archive up to date"
else
  rm -rf $G/site && mkdir -p $G/site
  "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
    $G/site $G/wheels/*.whl
  for d in $G/site/*.data; do  # a wheel's .data/purelib and platlib belong in the site folder itself
    for sub in purelib platlib; do [[ -d $d/$sub ]] && cp -r "$d/$sub/." $G/site/; done; rm -rf "$d"
  done
  du -sm $G/site | awk '{print "site before slimming: " $1 " MiB"}'
  rm -rf $G/site/studio $G/site/unsloth/studio $G/site/test $G/site/tests \
    $G/site/gradio/templates $G/site/gradio/_frontend_code
  find $G/site/bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*cuda130*' -delete
  find $G/site -depth -type d \( -name __pycache__ -o -name tests -o -name test -o -name docs \) -exec rm -rf {} +
  find $G/site -name '*.pyi' -delete
  helper distinfo $G/site
  du -sm $G/site | awk '{print "site after slimming:  " $1 " MiB"}'
  tar -C $G/site -cf - . | xz -T0 -6 > $G/site.tar.xz.part && mv $G/site.tar.xz.part $G/site.tar.xz
  echo "$stamp" > $G/stamp
fi

helper verify $G/site
probe=$(mktemp -d); tar -xJf $G/site.tar.xz -C "$probe"
echo "archive unpacks: $(find "$probe" -type f | wc -l) files, same as the site folder: $(find $G/site -type f | wc -l)"
rm -rf "$probe"
echo "cp312 extension modules (by top-level package):"
find $G/site -name '*.so' -printf '%P\n' | cut -d/ -f1 | sort | uniq -c \
  | awk '{printf "  %s (%s)", $2, $1} END {print ""}'
if [[ -n "$PY312" ]]; then  # the ones that import without torch or CUDA, on a real Python 3.12
  tops=$(find $G/site -name '*.cpython-312-*.so' -o -name '*.abi3.so' | sed "s|$G/site/||" | cut -d/ -f1 \
    | sed 's/\..*//' | sort -u | grep -v -x -E 'bitsandbytes|torchao')
  PYTHONPATH=$G/site "$PY312" - $tops <<'EOF'
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
  echo "  bitsandbytes, torchao: need torch with CUDA, imported only on the device"
fi

archive=$(stat -c %s $G/site.tar.xz)
tree=$( (git ls-files; git ls-files -o --exclude-standard) | sort -u \
  | while read -r f; do [[ -f $f ]] && stat -c %s "$f"; done \
  | awk '{s += $1} END {print s + 0}')
awk -v a="$archive" -v t="$tree" 'BEGIN {
  printf "archive .gpu/site.tar.xz: %.1f MiB; working tree that travels: %.1f MiB; together %.1f MiB of 64\n",
    a / 2^20, t / 2^20, (a + t) / 2^20
  if (a > 50 * 2^20 || a + t > 64 * 2^20) { print "TOO BIG"; exit 1 } }'
