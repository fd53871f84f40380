#!/usr/bin/env bash
# The MoE router kernels (kernels/cuda/moe.cu) run a warp per token with no per-thread
# array sized by the expert count: a stack frame there is local memory the driver
# reserves for every resident thread (2-4 KiB each was ~1 GiB on an H100). Compiles
# moe.cu with ptxas's report (-Xptxas -v) for sm_80 and sm_90 and fails if any instance of
# router_forward_kernel or router_backward_kernel has a non-zero stack frame or spills.
# Prints one line per instance: kernel<type>, arch, registers, stack bytes, spill store /
# load bytes. Needs no GPU, only nvcc. Exit 0: pass ("SKIP ..." without nvcc); 1: fail.
# Usage: bash tests/cuda/test_router_stack.sh [BUILD_DIR | MOE_CU]   (from anywhere)
# With a build directory it reads the report the build kept (BUILD/kernels/cuda/moe.ptxas)
# when it is newer than the sources; with a .cu file it compiles that one instead of
# kernels/cuda/moe.cu (e.g. an older version, to see this test fail).
set -uo pipefail
arg=${1:+$(realpath "$1")}
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
source=kernels/cuda/moe.cu
build=
case "$arg" in
  *.cu) source=$arg ;;
  ?*) build=$arg ;;
esac
source tests/cuda/ptxas_report.sh
if [ ! -x "$nvcc" ]; then
  echo "SKIP: no nvcc (set NVCC or CUDA_HOME)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ptxas_report "$source" "${build:+$build/kernels/cuda/moe.ptxas}" "$tmp/ptxas.log" kernels/cuda/moe.cu \
  kernels/moe_router.h kernels/cuda/moe_router_kernels.cuh || exit 1
# The router kernels' instances as kernel<type>: 2 kernels x float, bf16 x sm_80, sm_90.
ptxas_entries "$tmp/ptxas.log" | awk -F '\t' -v OFS='\t' '
  match($1, /router_(forward|backward)_kernel/) {
    rest = substr($1, RSTART + RLENGTH)
    $1 = substr($1, RSTART, RLENGTH) "<" (rest ~ /^(If|<float)/ ? "float" : rest ~ /bfloat16/ ? "bf16" : "?") ">"
    print
  }' | ptxas_verdict 0 8 "router kernel"
