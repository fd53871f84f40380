#!/usr/bin/env bash
# Throughput of trident beside the sgemm peak and beside PyTorch, in one run.
# Usage: benchmarks/run_benchmarks.sh [BUILD_DIR] [--quick]   (from the repository root)
#   --quick: tiny models only (seconds); the full run adds GPT-2 124M and Llama 125M
#   (trident, PyTorch as installed and PyTorch tuned: benchmarks/pytorch_tuned.sh), then
#   one summary line per model: trident over tuned PyTorch, tokens/s and peak RSS (minutes).
set -euo pipefail
build=${1:-build}
quick=${2:-}
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
[[ $flags == *" avx512f "* ]] && isa=AVX-512 || { [[ $flags == *" avx2 "* ]] && isa="AVX2, no AVX-512" || isa="no AVX2"; }
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($isa), $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-all}"
echo
row=$("$build/bench/throughput" --config configs/tiny.ini --steps 20 --header)
echo "$row"
peak_of() { echo "$1" | tail -1 | awk -F'|' '{gsub(/ /, "", $8); print $8}'; }  # sgemm peak of that run
peak=$(peak_of "$row")
gpt2_row= llama_row=
if [ "$quick" != "--quick" ]; then
  gpt2_row=$("$build/bench/throughput" --config configs/gpt2-124m.ini --steps 3)
  echo "$gpt2_row"
fi
"$build/bench/throughput" --config configs/tiny-llama.ini --steps 20
if [ "$quick" != "--quick" ]; then
  llama_row=$("$build/bench/throughput" --config configs/llama-125m.ini --steps 3)
  echo "$llama_row"
fi

if ! { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; }; then
  echo "(PyTorch peer skipped: apt-get install python3-torch)"
  exit 0
fi
# PyTorch as installed: with Debian's reference BLAS (libblas3, the default alternative)
# it runs near 5 GFLOP/s on one core, some 10 minutes per step of a 124M model; it then
# runs 1 sequence, one step without warm-up, and the tiny models one step.
stock_setup=$(cd benchmarks && /usr/bin/python3 -c "import torch, torch_peer; print(torch_peer.setup())")
stock_big=(--steps 1) stock_tiny=(--steps 20)
if [[ $stock_setup == *"reference BLAS"* ]]; then
  stock_big=(--batch 1 --steps 1 --warmup 0) stock_tiny=(--steps 1)
fi
tuned=(benchmarks/pytorch_tuned.sh)
if ! tuned_note=$("${tuned[@]}" true 2>&1); then
  echo "(tuned PyTorch skipped: $tuned_note)"
  tuned=()
fi
py=/usr/bin/python3
gpt2_124m=(--layers 12 --heads 12 --dim 768 --seq 1024 --vocab 50257 --batch 4)
llama_125m=(--layers 12 --heads 12 --kv-heads 4 --dim 768 --ffn 2048 --seq 1024 --vocab 32000 --batch 4)
$py benchmarks/pytorch_gpt2.py "${stock_tiny[@]}" --peak "$peak"
[ ${#tuned[@]} -eq 0 ] || "${tuned[@]}" $py benchmarks/pytorch_gpt2.py --steps 20 --peak "$peak" 2>/dev/null
$py benchmarks/pytorch_llama.py "${stock_tiny[@]}" --peak "$peak"
[ ${#tuned[@]} -eq 0 ] || "${tuned[@]}" $py benchmarks/pytorch_llama.py --steps 20 --peak "$peak" 2>/dev/null
[ "$quick" = "--quick" ] && exit 0

gpt2_tuned= llama_tuned=
$py benchmarks/pytorch_gpt2.py "${gpt2_124m[@]}" "${stock_big[@]}" --peak "$(peak_of "$gpt2_row")"
if [ ${#tuned[@]} -gt 0 ]; then
  gpt2_tuned=$("${tuned[@]}" $py benchmarks/pytorch_gpt2.py "${gpt2_124m[@]}" --steps 2 --peak "$(peak_of "$gpt2_row")" 2>/dev/null)
  echo "$gpt2_tuned"
fi
$py benchmarks/pytorch_llama.py "${llama_125m[@]}" "${stock_big[@]}" --peak "$(peak_of "$llama_row")"
if [ ${#tuned[@]} -gt 0 ]; then
  llama_tuned=$("${tuned[@]}" $py benchmarks/pytorch_llama.py "${llama_125m[@]}" --steps 2 --peak "$(peak_of "$llama_row")" 2>/dev/null)
  echo "$llama_tuned"
fi
echo
echo "${tuned_note:-}" | sed 's/^pytorch_tuned.sh: /tuned PyTorch: /'
summary() {  # name, trident row, tuned PyTorch row: tokens/s ($6) and peak RSS ($10) ratios
  if [ -z "$3" ]; then echo "$1: no tuned PyTorch row"; return; fi
  printf '%s\n%s\n' "$2" "$3" | awk -F'|' -v name="$1" '
    { gsub(/ /, "", $6); gsub(/ /, "", $10); tok[NR] = $6; rss[NR] = $10 }
    END { printf "%s: trident / tuned PyTorch: tokens/s %s / %s = %.2fx, peak RSS %s / %s GiB = %.2fx\n",
                 name, tok[1], tok[2], tok[1] / tok[2], rss[1], rss[2], rss[1] / rss[2] }'
}
summary "GPT-2 124M" "$gpt2_row" "$gpt2_tuned"
summary "Llama 125M" "$llama_row" "$llama_tuned"
