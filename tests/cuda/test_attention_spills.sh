#!/usr/bin/env bash
# The scalar flash-attention kernels (kernels/cuda/attention_scalar_kernels.cuh) keep a
# row's vectors in registers; a register spill goes to local memory and costs more than
# the kernel's arithmetic. Compiles kernels/cuda/attention.cu with ptxas's report
# (-Xptxas -v) for sm_80 and sm_90 and fails if any instance of flash_forward_kernel,
# flash_backward_kv_kernel or flash_backward_q_kernel stores or loads spilled registers,
# or has a stack frame over 256 bytes. Prints one line per instance: kernel<HD, type>,
# arch, registers, stack bytes, spill store / load bytes. Needs no GPU, only nvcc.
# Exit 0: pass ("SKIP ..." without nvcc); 1: fail.
# Usage: bash tests/cuda/test_attention_spills.sh [BUILD_DIR]   (from anywhere)
# With a build directory it reads the report the build kept (the Makefile compiles every
# .cu with -Xptxas -v into BUILD/kernels/cuda/NAME.ptxas), when it is newer than the
# sources; otherwise it compiles attention.cu itself.
set -uo pipefail
build=${1:+$(realpath "$1")}
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
source tests/cuda/ptxas_report.sh
if [ ! -x "$nvcc" ]; then
  echo "SKIP: no nvcc (set NVCC or CUDA_HOME)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ptxas_report kernels/cuda/attention.cu "${build:+$build/kernels/cuda/attention.ptxas}" "$tmp/ptxas.log" \
  kernels/cuda/attention_scalar_kernels.cuh || exit 1
# The scalar flash kernels' instances as kernel<HD, type>; NAME is mangled
# (flash_q...kernelILi128E13__nv_bfloat16E...) or demangled (flash_..._kernel<128, __nv_bfloat16>).
ptxas_entries "$tmp/ptxas.log" | awk -F '\t' -v OFS='\t' '
  match($1, /flash_(forward|backward_kv|backward_q)_kernel/) {
    kernel = substr($1, RSTART, RLENGTH)
    rest = substr($1, RSTART + RLENGTH)
    if (match(rest, /^ILi[0-9]+E/)) {  # mangled: ILi<HD>E then f or 13__nv_bfloat16
      hd = substr(rest, 4, RLENGTH - 4)
      rest = substr(rest, RLENGTH + 1)
      type = rest ~ /^f/ ? "float" : rest ~ /bfloat16/ ? "bf16" : "?"
    } else if (match(rest, /^<[0-9]+, *[A-Za-z_0-9]+/)) {  # demangled
      hd = substr(rest, 2, index(rest, ",") - 2)
      type = rest ~ /^<[0-9]+, *float/ ? "float" : rest ~ /bfloat16/ ? "bf16" : "?"
    } else {
      hd = "?"; type = "?"
    }
    $1 = kernel "<" hd ", " type ">"
    print
  }' | ptxas_verdict 256 1 "scalar flash kernel"
