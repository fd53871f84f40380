# Sourced by the tests that read ptxas's report (test_attention_spills.sh,
# test_router_stack.sh): the report of one .cu file, its entry functions as a table, and
# the verdict on the ones a test names. Needs no GPU, only nvcc.

nvcc=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}

# ptxas_report SOURCE KEPT LOG [NEWER_THAN...]: ptxas's report of SOURCE in LOG: the one
# the build kept (KEPT: BUILD/kernels/cuda/NAME.ptxas, the Makefile compiles every .cu with
# -Xptxas -v) when it is newer than SOURCE and the NEWER_THAN files, else nvcc's with the
# Makefile's flags for sm_80 and sm_90 (-Ikernels/cuda: a .cu from elsewhere finds the
# includes). Returns 0; 1 when nvcc could not compile it (its output printed).
ptxas_report() {
  local source=$1 kept=$2 log=$3 file fresh=0
  shift 3
  if [ -n "$kept" ] && [ -s "$kept" ]; then
    fresh=1
    for file in "$source" "$@"; do [ "$kept" -nt "$file" ] || fresh=0; done
  fi
  if [ $fresh = 1 ]; then
    cp "$kept" "$log"
    echo "ptxas's report kept by the build: $kept"
  elif ! "$nvcc" -std=c++20 -O3 -lineinfo -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -I. -Isrc -Ikernels/cuda -Xptxas -v -c "$source" -o "$log.o" > "$log" 2>&1; then
    cat "$log"
    echo "FAIL: nvcc could not compile $source"
    return 1
  fi
}

# ptxas_entries LOG: a line per entry function: its name (mangled or demangled), arch,
# registers, stack bytes, spill store and spill load bytes, tab-separated. ptxas reports
# each in three lines: "Compiling entry function 'NAME' for 'sm_XX'", then "N bytes stack
# frame, N bytes spill stores, N bytes spill loads", then "Used N registers, ...".
ptxas_entries() {
  awk '
    function number_before(line, word,    at, head, n) {  # the integer just before `word`
      at = index(line, word)
      if (at == 0) return -1
      head = substr(line, 1, at - 1)
      sub(/[ \t]+$/, "", head)
      n = split(head, parts, /[^0-9]+/)
      return parts[n] + 0
    }
    /Compiling entry function/ {
      split($0, quoted, "\047")
      name = quoted[2]; arch = quoted[4]; stack = 0; stores = 0; loads = 0
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
      printf "%s\t%s\t%d\t%d\t%d\t%d\n", name, arch, number_before($0, "registers"), stack, stores, loads
      name = ""
    }
  ' "$1"
}

# ptxas_verdict MAX_STACK AT_LEAST WHAT: from stdin's lines (ptxas_entries' columns, the
# name given a readable label by the caller), the table, then PASS, or FAIL (return 1)
# where one spills or has a stack frame over MAX_STACK bytes, or fewer than AT_LEAST came.
ptxas_verdict() {
  awk -F '\t' -v max_stack="$1" -v at_least="$2" -v what="$3" '
    BEGIN { printf "%-36s %-6s %9s %7s %12s %11s\n", "kernel", "arch", "registers", "stack", "spill_stores", "spill_loads" }
    {
      bad = $5 > 0 || $6 > 0 || $4 > max_stack
      printf "%-36s %-6s %9d %7d %12d %11d%s\n", $1, $2, $3, $4, $5, $6, bad ? "  <- FAIL" : ""
      found++; failed += bad
    }
    END {
      if (found < at_least) { printf "FAIL: ptxas reported %d %s instances, not %d or more\n", found, what, at_least; exit 1 }
      if (failed > 0) { printf "FAIL: %d of %d %s instances spill or have a stack frame over %d bytes\n", failed, found, what, max_stack; exit 1 }
      printf "PASS: %d %s instances, no spills, stack frames <= %d bytes\n", found, what, max_stack
    }
  '
}
