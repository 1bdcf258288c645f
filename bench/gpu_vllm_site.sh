#!/usr/bin/env bash
# Pack vLLM for the GPU machine (the colocated path, fast_inference=True) and split what one GPU run needs into
# parts that each travel in one call: WORK/ship/1, 2, ... hold pieces of the kit's site archive (bench/gpu_site.sh)
# and of WORK/vllm.tar.xz, with a manifest; bench/gpu_ship.sh puts them back together on the machine.
#
# The vLLM is the one built for the GPU machine's torch (GPU_VLLM in bench/gpu_machine.env: vllm 0.26.0 pins torch
# 2.11.0, the machine's; the vllm 0.29.0 of requirements-gpu.txt pins torch 2.13.0). Its requirements are followed
# through the wheels' metadata, less what the machine has (the --packages list and GPU_KEEP), what the kit's site
# archive already carries, and GPU_VLLM_SKIP (kernels for other chips and features the kit never calls); the files
# GPU_VLLM_DROP names (FlashAttention 2, which Hopper doesn't pick, the optional Rust frontend, Blackwell's kernels)
# are left out of the unpacked wheels.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bash bench/gpu_vllm_site.sh [OPTIONS]

Build WORK/vllm.tar.xz and split it, with WORK/site.tar.xz (run bash bench/gpu_site.sh first), into WORK/ship/N.
  --packages FILE     the packages the GPU machine has [GPU_PACKAGES_FILE]; without it, GPU_KEEP alone
  --part-mib N        the most one part may hold [GPU_SHIP_PART_MIB; default: GPU_CARRY_LIMIT_MIB less the tree, less 1]
  --work-dir DIR      [GPU_SITE_WORK; default .gpu]
  (GPU_VLLM_XZ_LEVEL: xz's level for the vLLM archive, default 6; 1 packs 650 MiB in a minute on 2 cores, larger)
  --machine-env FILE  [GPU_MACHINE_ENV; default bench/gpu_machine.env]
  -h, --help
EOF
}

while (( $# )); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --packages|--part-mib|--work-dir|--machine-env)
      (( $# >= 2 )) || { echo "gpu_vllm_site.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --packages) GPU_PACKAGES_FILE=$2 ;; --part-mib) GPU_SHIP_PART_MIB=$2 ;;
        --work-dir) GPU_SITE_WORK=$2 ;; --machine-env) GPU_MACHINE_ENV=$2 ;;
      esac
      shift ;;
    *) echo "gpu_vllm_site.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
source bench/load_machine.sh  # the GPU machine's description: MACHINE_ENV
G=${GPU_SITE_WORK:-.gpu}; G=${G%/}
PY=${BENCH_PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
[[ -s $G/site.tar.xz && -d $G/site ]] \
  || { echo "gpu_vllm_site.sh: no $G/site.tar.xz: run bash bench/gpu_site.sh first" >&2; exit 2; }
export G GPU_KEEP GPU_VLLM GPU_VLLM_SKIP GPU_PACKAGES_FILE GPU_PYTHON_VERSION GPU_ARCH
mkdir -p "$G/vllm-wheels"
platforms=(); for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_${GPU_ARCH}"); done
download() {  # pip download --no-deps SPEC... for the GPU machine's Python and CPU
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON_VERSION" --implementation cp \
    "${platforms[@]}" --platform "manylinux2014_${GPU_ARCH}" --platform "manylinux1_${GPU_ARCH}" --platform any \
    -d "$G/vllm-wheels" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# Follow the requirements level by level: each round names the specs no cached wheel meets yet.
for round in 1 2 3 4 5 6 7 8; do
  mapfile -t wanted < <("$PY" - <<'EOF'
import glob, os, re, zipfile
from packaging.requirements import Requirement
from packaging.version import Version
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
G = os.environ["G"]
have = set(norm(n) for n in os.environ["GPU_KEEP"].split())
path = os.environ.get("GPU_PACKAGES_FILE", "")
if path and os.path.isfile(path):  # the machine's list follows its last "Packages:", if any
    text = "\n".join(line.split("#")[0] for line in open(path).read().splitlines())
    have |= {norm(n.strip(" .`'\"")) for n in re.split(r"[,\s]+", text.split("Packages:")[-1]) if n.strip(" .`'\"")}
have |= {norm(os.path.basename(d).split("-")[0]) for d in glob.glob(f"{G}/site/*.dist-info")}  # the kit's archive
skip = {norm(n) for n in os.environ["GPU_VLLM_SKIP"].split()}
wheels = {}  # {name: [(version, wheel)], newest first}
for w in glob.glob(f"{G}/vllm-wheels/*.whl"):
    name, version = os.path.basename(w).split("-")[:2]
    wheels.setdefault(norm(name), []).append((Version(version), w))
wheels = {name: sorted(found, reverse=True) for name, found in wheels.items()}
env = {"python_version": os.environ["GPU_PYTHON_VERSION"], "platform_machine": os.environ["GPU_ARCH"],
       "platform_system": "Linux", "sys_platform": "linux", "implementation_name": "cpython"}
# Breadth first, so a requirement nearer vLLM chooses a distribution's version (vllm pins apache-tvm-ffi 0.1.10 where
# a deeper one asks for newer); one version of each.
todo, chosen, seen, out = [Requirement(s) for s in os.environ["GPU_VLLM"].split()], {}, set(), []
while todo:
    req = todo.pop(0)
    name = norm(req.name)
    if name in skip or name in have:
        continue
    if name not in chosen:
        fits = [found for found in wheels.get(name, []) if req.specifier.contains(found[0], prereleases=True)]
        if not fits:
            out.append("get " + str(req).split(";")[0])
            continue
        chosen[name] = fits[0]
        out.append("use " + fits[0][1])
    elif not req.specifier.contains(chosen[name][0], prereleases=True):  # pin a version both take in GPU_VLLM
        out.append(f"conflict {name} {chosen[name][0]} chosen, another requirement wants {req}")
    key = (name, tuple(sorted(req.extras)))
    if key in seen:
        continue
    seen.add(key)
    meta = zipfile.ZipFile(chosen[name][1])
    text = meta.read(next(n for n in meta.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            sub = Requirement(line.split(":", 1)[1].strip())
            if not sub.marker or any(sub.marker.evaluate({**env, "extra": e}) for e in (req.extras or {""})):
                sub.marker = None
                todo.append(sub)
print("\n".join(sorted(set(out))))
EOF
)
  mapfile -t use < <(printf '%s\n' "${wanted[@]}" | sed -n 's/^use //p')
  mapfile -t conflicts < <(printf '%s\n' "${wanted[@]}" | sed -n 's/^conflict //p')
  mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | sed -n 's/^get //p')
  (( ${#wanted[@]} )) || break
  echo "round $round: downloading ${#wanted[@]}: ${wanted[*]}"
  download "${wanted[@]}"
done
if (( ${#conflicts[@]} )); then
  printf 'gpu_vllm_site.sh: %s (pin one both take in GPU_VLLM)\n' "${conflicts[@]}" >&2; exit 1
fi
(( ${#wanted[@]} == 0 )) \
  || { echo "gpu_vllm_site.sh: requirements still unmet after 8 rounds: ${wanted[*]}" >&2; exit 1; }

echo "carrying ${#use[@]} distributions"
stamp=$( (printf '%s\n' "${use[@]}" | sort; ls "$G/site"; cat "$0" "$MACHINE_ENV") | sha256sum | cut -c1-16)
if [[ -s $G/vllm.tar.xz && "$(cat "$G/vllm.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "vllm archive up to date"
else
  rm -rf "$G/vllm-site" && mkdir -p "$G/vllm-site"
  "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
    "$G/vllm-site" "${use[@]}"
  for d in "$G"/vllm-site/*.data; do
    [[ -d $d ]] || continue
    for sub in purelib platlib; do [[ -d $d/$sub ]] && cp -r "$d/$sub/." "$G/vllm-site/"; done; rm -rf "$d"
  done
  du -sm "$G/vllm-site" | awk '{print "vllm site before slimming: " $1 " MiB"}'
  for p in $GPU_VLLM_DROP; do rm -rf "${G:?}/vllm-site/$p"; done
  # compiled modules for other Pythons than the machine's
  find "$G/vllm-site" -name '*.cpython-3*-*.so' ! -name "*.cpython-${GPU_PYTHON_VERSION//./}-*" -delete
  find "$G/vllm-site" -depth -type d \( -name __pycache__ -o -name tests -o -name test \) -exec rm -rf {} +
  find "$G/vllm-site" -name '*.pyi' -delete
  du -sm "$G/vllm-site" | awk '{print "vllm site after slimming:  " $1 " MiB"}'
  tar -C "$G/vllm-site" -cf - . | xz -T0 "-${GPU_VLLM_XZ_LEVEL:-6}" > "$G/vllm.tar.xz.part" \
    && mv "$G/vllm.tar.xz.part" "$G/vllm.tar.xz"
  echo "$stamp" > "$G/vllm.stamp"
fi

# Split both archives into parts that each travel with the working tree in one call.
tree=$( (git ls-files; git ls-files -o --exclude-standard) | sort -u \
  | while read -r f; do [[ -f $f ]] && stat -c %s "$f"; done \
  | awk '{s += $1} END {print int(s / 2^20) + 1}')
part_mib=${GPU_SHIP_PART_MIB:-$((GPU_CARRY_LIMIT_MIB - tree - 1))}
rm -rf "$G/ship"
# One stream, the two archives back to back, cut into parts; the manifest says where each archive starts and ends.
(cd "$G" && for f in site.tar.xz vllm.tar.xz; do echo "$f $(stat -c %s "$f") $(sha256sum < "$f" | cut -c1-64)"; done) \
  > "$G/manifest"
cat "$G/site.tar.xz" "$G/vllm.tar.xz" | split -b "${part_mib}M" -d -a 2 - "$G/piece."
n=0
for piece in "$G"/piece.*; do
  n=$((n + 1)); mkdir -p "$G/ship/$n"; mv "$piece" "$G/ship/$n/"; cp "$G/manifest" "$G/ship/$n/"
done
echo "vllm archive: $(du -m "$G/vllm.tar.xz" | cut -f1) MiB; site archive: $(du -m "$G/site.tar.xz" | cut -f1) MiB;" \
  "working tree ${tree} MiB; $n parts of at most ${part_mib} MiB:"
for i in $(seq 1 "$n"); do echo "  $G/ship/$i: $(du -sm "$G/ship/$i" | cut -f1) MiB"; done
echo "send them in $n back-to-back runs (each: carry $G/ship/N; bash bench/gpu_ship.sh $G/ship/N)," \
  "the last one with the work"
