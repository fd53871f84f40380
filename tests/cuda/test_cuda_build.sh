#!/usr/bin/env bash
# What the CUDA build holds, checked without a GPU: every kernel object carries SASS for
# sm_80 and sm_90 and compute_90 PTX (which the driver compiles for a newer GPU: without
# it a build cannot run there at all); and no executable needs libcudart.so (the runtime is
# linked statically: a bundle runs beside any toolkit, or none). Usage:
# tests/cuda/test_cuda_build.sh BUILD_DIR
# Exit 0: pass; 1: fail; prints SKIP and exits 0 in a build without CUDA objects.
set -uo pipefail
build=${1:-build}
objects=$(ls "$build"/kernels/cuda/*.o 2>/dev/null)
[ -n "$objects" ] || { echo "SKIP: no CUDA objects in $build (no nvcc)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for o in $objects; do
  objcopy -O binary --only-section=.nv_fatbin "$o" "$tmp/fatbin" 2>/dev/null
  [ -s "$tmp/fatbin" ] || continue  # host code only (the backend's dispatch)
  entries=$(python3 "$(dirname "$0")/fatbin_entries.py" "$tmp/fatbin" | sort -u | tr '\n' ' ')
  missing=""
  for want in "elf 80" "elf 90" "ptx 90"; do
    grep -q "$want" <<< "$entries" || missing="$missing [$want]"
  done
  if [ -n "$missing" ]; then
    echo "FAIL: $(basename "$o") holds $entries; missing$missing"
    status=1
  else
    echo "ok: $(basename "$o"): $entries"
  fi
done
for exe in "$build"/trident "$build"/bench/kernel_check; do
  [ -x "$exe" ] || continue
  if readelf -d "$exe" | grep -q 'NEEDED.*libcudart'; then
    echo "FAIL: $exe needs $(readelf -d "$exe" | grep -o 'libcudart[^]]*') (the runtime is to be linked statically)"
    status=1
  else
    echo "ok: $(basename "$exe") needs no libcudart.so"
  fi
done
exit $status
