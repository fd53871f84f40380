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
max_stack=256
nvcc=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
if [ ! -x "$nvcc" ]; then
  echo "SKIP: no nvcc (set NVCC or CUDA_HOME)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kept=${build:+$build/kernels/cuda/attention.ptxas}
if [ -n "$kept" ] && [ -s "$kept" ] && [ "$kept" -nt kernels/cuda/attention.cu ] &&
   [ "$kept" -nt kernels/cuda/attention_scalar_kernels.cuh ]; then
  cp "$kept" "$tmp/ptxas.log"
  echo "ptxas's report kept by the build: $kept"
# The Makefile's nvcc flags, with ptxas's report.
elif ! "$nvcc" -std=c++20 -O3 -lineinfo -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -I. -Isrc -Xptxas -v -c kernels/cuda/attention.cu -o "$tmp/attention.o" > "$tmp/ptxas.log" 2>&1; then
  cat "$tmp/ptxas.log"
  echo "FAIL: nvcc could not compile kernels/cuda/attention.cu"
  exit 1
fi

# ptxas reports each entry function in three lines: "Compiling entry function 'NAME' for
# 'sm_XX'", then "N bytes stack frame, N bytes spill stores, N bytes spill loads", then
# "Used N registers, ...". NAME is mangled (flash_q...kernelILi128E13__nv_bfloat16E...)
# or demangled (flash_..._kernel<128, __nv_bfloat16>).
awk -v max_stack="$max_stack" '
  function number_before(line, word,    at, head, n) {  # the integer just before `word`
    at = index(line, word)
    if (at == 0) return -1
    head = substr(line, 1, at - 1)
    sub(/[ \t]+$/, "", head)
    n = split(head, parts, /[^0-9]+/)
    return parts[n] + 0
  }
  function label(name,    kernel, rest, hd, type) {  # kernel<HD, type>, or "" if not a scalar flash kernel
    if (!match(name, /flash_(forward|backward_kv|backward_q)_kernel/)) return ""
    kernel = substr(name, RSTART, RLENGTH)
    rest = substr(name, RSTART + RLENGTH)
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
    return kernel "<" hd ", " type ">"
  }
  BEGIN { printf "%-36s %-6s %9s %7s %12s %11s\n", "kernel", "arch", "registers", "stack", "spill_stores", "spill_loads" }
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
    bad = stores > 0 || loads > 0 || stack > max_stack
    printf "%-36s %-6s %9d %7d %12d %11d%s\n", name, arch, registers, stack, stores, loads, bad ? "  <- FAIL" : ""
    found++; failed += bad
    name = ""
  }
  END {
    if (found == 0) { print "FAIL: ptxas reported none of the scalar flash kernels"; exit 1 }
    if (failed > 0) { printf "FAIL: %d of %d kernel instances spill or have a stack frame over %d bytes\n", failed, found, max_stack; exit 1 }
    printf "PASS: %d kernel instances, no spills, stack frames <= %d bytes\n", found, max_stack
  }
' "$tmp/ptxas.log"
