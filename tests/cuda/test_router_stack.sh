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
nvcc=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
if [ ! -x "$nvcc" ]; then
  echo "SKIP: no nvcc (set NVCC or CUDA_HOME)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kept=${build:+$build/kernels/cuda/moe.ptxas}
if [ -n "$kept" ] && [ -s "$kept" ] && [ "$kept" -nt kernels/cuda/moe.cu ] && [ "$kept" -nt kernels/moe_router.h ] &&
   [ "$kept" -nt kernels/cuda/moe_router_kernels.cuh ]; then
  cp "$kept" "$tmp/ptxas.log"
  echo "ptxas's report kept by the build: $kept"
# The Makefile's nvcc flags, with ptxas's report (-Ikernels/cuda: a .cu from elsewhere
# finds moe.cu's includes).
elif ! "$nvcc" -std=c++20 -O3 -lineinfo -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -I. -Isrc -Ikernels/cuda -Xptxas -v -c "$source" -o "$tmp/moe.o" > "$tmp/ptxas.log" 2>&1; then
  cat "$tmp/ptxas.log"
  echo "FAIL: nvcc could not compile $source"
  exit 1
fi

# ptxas reports each entry function in three lines: "Compiling entry function 'NAME' for
# 'sm_XX'", then "N bytes stack frame, N bytes spill stores, N bytes spill loads", then
# "Used N registers, ...". NAME is mangled (router_forward_kernelIfE...) or demangled.
awk '
  function number_before(line, word,    at, head, n) {  # the integer just before `word`
    at = index(line, word)
    if (at == 0) return -1
    head = substr(line, 1, at - 1)
    sub(/[ \t]+$/, "", head)
    n = split(head, parts, /[^0-9]+/)
    return parts[n] + 0
  }
  function label(name,    kernel, rest) {  # kernel<type>, or "" if not a router kernel
    if (!match(name, /router_(forward|backward)_kernel/)) return ""
    kernel = substr(name, RSTART, RLENGTH)
    rest = substr(name, RSTART + RLENGTH)
    return kernel "<" (rest ~ /^(If|<float)/ ? "float" : rest ~ /bfloat16/ ? "bf16" : "?") ">"
  }
  BEGIN { printf "%-30s %-6s %9s %7s %12s %11s\n", "kernel", "arch", "registers", "stack", "spill_stores", "spill_loads" }
  /Compiling entry function/ {
    split($0, quoted, "\047")
    name = label(quoted[2]); arch = quoted[4]; stack = 0; stores = 0; loads = 0
    next
  }
  /bytes stack frame/ {
    stack = number_before($0, "bytes stack frame")
    stores = number_before($0, "bytes spill stores")
    loads = number_before($0, "bytes spill loads")
    next
  }
  /Used [0-9]+ registers/ {
    if (name == "") next
    registers = number_before($0, "registers")
    bad = stores > 0 || loads > 0 || stack > 0
    printf "%-30s %-6s %9d %7d %12d %11d%s\n", name, arch, registers, stack, stores, loads, bad ? "  <- FAIL" : ""
    found++; failed += bad
    name = ""
  }
  END {
    if (found < 8) { printf "FAIL: ptxas reported %d router kernel instances, not 8 (2 kernels x float, bf16 x sm_80, sm_90)\n", found; exit 1 }
    if (failed > 0) { printf "FAIL: %d of %d router kernel instances have a stack frame or spill\n", failed, found; exit 1 }
    printf "PASS: %d router kernel instances, 0 bytes stack frame, no spills\n", found
  }
' "$tmp/ptxas.log"
