#!/usr/bin/env bash
# On the GPU machine: take one part that bench/gpu_vllm_site.sh cut (WORK/ship/N, carried with this run) into
# GPU_SHIP_DIR, which outlives the call while the machine stays up; once every part is there, put the site archive
# and the vLLM archive back together (checked against the manifest) and unpack them to GPU_SITE_DIR and
# GPU_VLLM_SITE_DIR, where bench/gpu_run.sh finds them. Send the parts in back-to-back runs, so the machine stays up.
#
#     bash bench/gpu_ship.sh .gpu/ship/1        # first run; then .gpu/ship/2, ...; the last run goes on with the work
set -euo pipefail
[[ ${1:-} && $1 != -* ]] \
  || { echo "Usage: bash bench/gpu_ship.sh PART_DIR  (a folder bench/gpu_vllm_site.sh made)"; exit 2; }
cd "$(dirname "$0")/.."
source bench/load_machine.sh  # the GPU machine's description: MACHINE_ENV
part=$1 S=$GPU_SHIP_DIR
[[ -f $part/manifest ]] \
  || { echo "gpu_ship.sh: $part has no manifest: carry a folder bench/gpu_vllm_site.sh made"; exit 2; }
mkdir -p "$S"
if [[ -f $S/manifest ]] && ! cmp -s "$S/manifest" "$part/manifest"; then
  echo "gpu_ship.sh: $part belongs to other archives than the parts already here: starting over"; rm -rf "${S:?}"/*
fi
cp "$part"/* "$S/"
mapfile -t sizes < <(awk '{print $2}' "$S/manifest")
have=$(cat "$S"/piece.* | wc -c)
total=$((sizes[0] + sizes[1]))
echo "gpu_ship.sh: $(ls "$S" | grep -c '^piece\.') parts here, $((have / 2**20)) of $((total / 2**20)) MiB"
(( have == total )) || exit 0
[[ -f $GPU_SITE_DIR/.unpacked && -f $GPU_VLLM_SITE_DIR/.unpacked ]] && { echo "gpu_ship.sh: already unpacked"; exit 0; }
cat "$S"/piece.* > "$S/both"  # not piped into head: its early exit would end the script (pipefail)
head -c "${sizes[0]}" "$S/both" > "$S/site.tar.xz"
tail -c "+$((sizes[0] + 1))" "$S/both" > "$S/vllm.tar.xz"
rm "$S/both"
while read -r name _ sum; do
  [[ $(sha256sum < "$S/$name" | cut -c1-64) == "$sum" ]] \
    || { echo "gpu_ship.sh: $name is damaged: send the parts again"; exit 1; }
done < "$S/manifest"
rm -rf "$GPU_SITE_DIR" "$GPU_VLLM_SITE_DIR"; mkdir -p "$GPU_SITE_DIR" "$GPU_VLLM_SITE_DIR"
tar -xJf "$S/site.tar.xz" -C "$GPU_SITE_DIR" & tar -xJf "$S/vllm.tar.xz" -C "$GPU_VLLM_SITE_DIR"; wait
touch "$GPU_SITE_DIR/.unpacked" "$GPU_VLLM_SITE_DIR/.unpacked"
echo "gpu_ship.sh: unpacked to $GPU_SITE_DIR and $GPU_VLLM_SITE_DIR ($SECONDS s)"
