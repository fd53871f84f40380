#!/usr/bin/env bash
# bf16 training on the CPU (issue 43), in one run: GPT-2 124M and Llama 125M, a whole step
# (build/bench/throughput) in fp32, in bf16 emulated (DNNL_MAX_CPU_ISA=AVX512_CORE hides the
# bf16 instructions from oneDNN, so the emulated path runs) and in bf16 with the GEMMs in
# bf16; beside tuned PyTorch (benchmarks/pytorch_tuned.sh) in fp32 and under its own bf16
# autocast. Ends with the ratios the issue asks for.
# Usage: benchmarks/cpu_bf16.sh [BUILD_DIR] [STEPS]   (from the repository root; ~15 min on 2 cores)
set -euo pipefail
build=${1:-build}
steps=${2:-2}
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
bf16_flags=
for f in avx512_bf16 amx_bf16; do [[ $flags == *" $f "* ]] && bf16_flags+="$f "; done
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
  "bf16 instructions: ${bf16_flags:-none}, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | batch x T | threads | step (s) | tokens/s | model GFLOP/s | sgemm peak GFLOP/s | of peak | peak RSS (GiB) | setup (s) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
tuned=(benchmarks/pytorch_tuned.sh /usr/bin/python3)
if ! note=$("${tuned[0]}" true 2>&1) || ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "(tuned PyTorch skipped: ${note:-python3-torch missing})"
  tuned=()
fi
tokens() { awk -F'|' '{gsub(/ /, "", $6); print $6}' <<< "$1"; }
ratio() { awk -v a="$(tokens "$1")" -v b="$(tokens "$2")" 'BEGIN { printf "%.2fx", a / b }'; }
summaries=()
for model in gpt2 llama; do
  if [ $model = gpt2 ]; then
    config=configs/gpt2-124m.ini peer=(benchmarks/pytorch_gpt2.py --layers 12 --heads 12 --dim 768 --seq 1024 --vocab 50257)
  else
    config=configs/llama-125m.ini
    peer=(benchmarks/pytorch_llama.py --layers 12 --heads 12 --kv-heads 4 --dim 768 --ffn 2048 --seq 1024 --vocab 32000)
  fi
  fp32=$("$build/bench/throughput" --config $config --steps "$steps")
  echo "$fp32"
  emulated=$(DNNL_MAX_CPU_ISA=AVX512_CORE "$build/bench/throughput" --config $config --steps "$steps" --train.precision=bf16)
  echo "$emulated"
  bf16=$("$build/bench/throughput" --config $config --steps "$steps" --train.precision=bf16)
  echo "$bf16"
  line="$model: bf16 / fp32 $(ratio "$bf16" "$fp32"), bf16 / bf16 emulated $(ratio "$bf16" "$emulated")"
  if [ ${#tuned[@]} -gt 0 ]; then
    torch_fp32=$("${tuned[@]}" "${peer[@]}" --batch 4 --steps "$steps" 2>/dev/null)
    echo "$torch_fp32"
    torch_bf16=$("${tuned[@]}" "${peer[@]}" --batch 4 --steps "$steps" --bf16 2>/dev/null)
    echo "$torch_bf16"
    line+=", bf16 / PyTorch fp32 $(ratio "$bf16" "$torch_fp32") (target >= 2x), bf16 / PyTorch autocast bf16"
    line+=" $(ratio "$bf16" "$torch_bf16") (target >= 1.2x), fp32 / PyTorch fp32 $(ratio "$fp32" "$torch_fp32")"
  fi
  summaries+=("$line")
done
echo
printf '%s\n' "${summaries[@]}"
