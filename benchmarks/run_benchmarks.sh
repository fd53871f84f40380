#!/usr/bin/env bash
# Throughput of trident beside the sgemm peak and beside PyTorch, in one run.
# Usage: benchmarks/run_benchmarks.sh [BUILD_DIR] [--quick]   (from the repository root)
#   --quick: tiny model only (seconds); the full run adds GPT-2 124M (minutes).
set -euo pipefail
build=${1:-build}
quick=${2:-}
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-all}"
echo
row=$("$build/bench/throughput" --config configs/tiny.ini --steps 20 --header)
echo "$row"
peak=$(echo "$row" | tail -1 | awk -F'|' '{gsub(/ /, "", $8); print $8}')  # sgemm peak of this run
[ "$quick" = "--quick" ] || "$build/bench/throughput" --config configs/gpt2-124m.ini --steps 3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 benchmarks/pytorch_gpt2.py --steps 20 --peak "$peak"
  [ "$quick" = "--quick" ] || /usr/bin/python3 benchmarks/pytorch_gpt2.py --layers 12 --heads 12 --dim 768 --seq 1024 --vocab 50257 --batch 4 --steps 1 --peak "$peak"
else
  echo "(PyTorch peer skipped: apt-get install python3-torch)"
fi
