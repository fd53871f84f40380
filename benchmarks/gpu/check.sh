#!/usr/bin/env bash
# The GPU check (issue 7), on a machine with one NVIDIA GPU, from the repository root:
#   1. build: the CUDA path is compiled whenever nvcc is found;
#   2. every CUDA kernel against the CPU kernel on fresh random inputs, bf16 then fp32,
#      each precision in a process of its own (a CUDA fault is sticky: it would end the
#      other's checks too), first without timing, then under compute-sanitizer where it
#      is installed, then with the timing tables: GPT-2 124M's shapes with flash vs naive
#      attention at T 1024, the Llama kernels (RMSNorm, SwiGLU, rotary, grouped-query
#      attention at T 2048 and 4096) at Llama-2-7B / Llama-3-8B shapes, the experts' grouped
#      GEMMs against a GEMM per expert at Qwen3-30B-A3B's (build/bench/kernel_check);
#   3. `trident verify` on the GPT-2, Llama and mixture-of-experts (Mixtral, Qwen3-MoE)
#      references with --device=cuda, bf16 and fp32 tolerances (grouped-query and multi-query
#      Llama references included), and once
#      with the scratch from cudaMalloc as on a GPU without memory pools;
#   4. 50 training steps of gpt2-124m at batch 16 x 1024, then 20 steps of a Llama of
#      1.2B parameters (16 layers, d 2048, 32 heads over 8, SwiGLU 8192, vocabulary
#      128256, batch 8 x 2048): tokens/s, MFU against the datasheet bf16 rate of the GPU the
#      driver names (H200: 989 TFLOP/s dense; the GEMM rate measured in step 2 beside it),
#      and the host synchronizations per step (summary.json; at most 2 is the target);
#   5. the default job of `make run` on the GPU where the fortunes corpus is installed.
#
#   bash benchmarks/gpu/check.sh [OUT_DIR]      (default runs/gpu_check; the log is OUT_DIR/check.log)
#
# Where the build dependencies (MPI, HDF5, Boost.PO, oneDNN, GoogleTest, nvcc) are missing
# and cannot be installed, make a bundle first on a Debian machine with nvcc
# (benchmarks/gpu/bundle.sh) and carry .gpu_bundle.tar.xz along: unless every one of them
# is here, this script then runs its executables instead (and says which are missing).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/gpu_check}
mkdir -p "$out"
exec > >(tee "$out/check.log") 2>&1
started=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - started )) s)"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || { echo "no GPU"; exit 2; }
nvcc --version | tail -1

source benchmarks/gpu/build_deps.sh
missing=$(missing_build_deps)
if [ -f .gpu_bundle.tar.xz ] && [ -n "$missing" ]; then
  step "using the executables of .gpu_bundle.tar.xz (built elsewhere by bundle.sh)"
  echo "missing here for a build:"; sed 's/^/  /' <<< "$missing"
  tar -C /tmp -xJf .gpu_bundle.tar.xz 2>/dev/null ||  # without the xz program: Python's lzma
    python3 -c "import tarfile; tarfile.open('.gpu_bundle.tar.xz').extractall('/tmp')" || exit 2
  source benchmarks/gpu/bundle_env.sh /tmp/.gpu_bundle
  build=/tmp/.gpu_bundle/build
else
  step "build"
  [ -z "$missing" ] || { echo "missing here, and no .gpu_bundle.tar.xz:"; sed 's/^/  /' <<< "$missing"; }
  make -j"$(nproc)" all 2>&1 | grep -E "error|trident build|nvcc:|^  MPI" || true
  build=build
fi
[ -x $build/trident ] && [ -x $build/bench/kernel_check ] || { echo "no executables: the build failed"; exit 2; }
$build/trident --version

status=0
step "kernels: CUDA against CPU, each precision in its own process (bf16 first), no timing"
for precision in bf16 fp32; do
  $build/bench/kernel_check --precision $precision --no-timing --seed 1 || status=1
done
if command -v compute-sanitizer > /dev/null; then
  step "compute-sanitizer memcheck on the same checks"
  for precision in bf16 fp32; do
    compute-sanitizer --tool memcheck --error-exitcode 9 $build/bench/kernel_check --precision $precision \
      --no-timing --seed 1 > "$out/sanitizer_$precision.log" 2>&1 || { status=1; tail -40 "$out/sanitizer_$precision.log"; }
    grep -E "ERROR SUMMARY|^PASS|^FAIL" "$out/sanitizer_$precision.log"
  done
fi
step "kernel timings (bf16, then fp32)"
for precision in bf16 fp32; do
  $build/bench/kernel_check --precision $precision --seed 2 || status=1
done

step "verify on the references with --device=cuda"
for precision in bf16 fp32; do
  $build/trident verify --reference tests/data/gpt2_ref_a.h5 --device=cuda --train.precision=$precision || status=1
done
$build/trident verify --reference tests/data/gpt2_ref_h6_v101.h5 --device=cuda || status=1
for precision in bf16 fp32; do
  $build/trident verify --reference tests/data/llama_ref_a.h5 --device=cuda --train.precision=$precision || status=1
done
for reference in llama_ref_h6_kv3_v101 llama_ref_mqa_v61; do  # 6 heads over 3 key/value heads; multi-query
  $build/trident verify --reference tests/data/$reference.h5 --device=cuda || status=1
done
for precision in bf16 fp32; do  # mixtures of experts: the router kernels and the grouped GEMMs
  for reference in mixtral_ref_e4 qwen3_moe_ref_e8; do
    $build/trident verify --reference tests/data/$reference.h5 --device=cuda --train.precision=$precision || status=1
  done
done
echo "without memory pools (the scratch cudaMalloc'd up front):"
TRIDENT_CUDA_NO_MEMORY_POOLS=1 $build/trident verify --reference tests/data/llama_ref_a.h5 --device=cuda \
  --train.precision=bf16 || status=1

step "50 steps of gpt2-124m, batch 16 x 1024, bf16"
data=/usr/share/games/fortunes
if [ ! -d "$data" ]; then  # any text will do for speed: this repository's
  data=$out/text
  mkdir -p "$data"
  cat README.md docs/*.md src/*/*.h src/*/*.cpp kernels/*/*.cpp kernels/*/*.cu > "$data/corpus.txt"
fi
$build/trident train --config configs/gpt2-124m.ini --device=cuda --train.steps=50 --train.global_batch=16 \
  --train.micro_batch=16 --train.warmup_steps=5 --data.path="$data" --log.run_dir="$out/train" \
  --log.val_batches=0 --log.every_steps=5 | tee "$out/train_gpt2.log" || status=1

step "20 steps of a 1.2B Llama (L16, d 2048, 32/8 heads, ffn 8192, V 128256), batch 8 x 2048, bf16"
$build/trident train --config configs/llama3-8b.ini --device=cuda --train.precision=bf16 --model.n_layer=16 \
  --model.d_model=2048 --model.n_head=32 --model.n_kv_head=8 --model.ffn_dim=8192 --model.seq_len=2048 \
  --parallel.tp=1 --parallel.pp=1 --parallel.zero=0 --train.global_batch=8 --train.micro_batch=8 \
  --train.steps=20 --train.warmup_steps=5 --data.path="$data" --data.tokenizer=byte \
  --log.run_dir="$out/train_llama" --log.val_batches=0 --log.every_steps=5 | tee "$out/train_llama.log" || status=1

step "throughput (the last logged step of each run)"
for run in gpt2 llama; do
  line=$(grep -E '^step +[0-9]+/' "$out/train_$run.log" | tail -1)
  echo "$run: $(grep -oE '[0-9]+ tok/s' <<< "$line" || echo "no step logged"), $(grep -oE 'MFU [0-9.]+%' <<< "$line")"
  grep -m1 '^MFU peak:' "$out/train_$run.log" || true
done
for summary in "$out/train/summary.json" "$out/train_llama/summary.json"; do
  [ -f "$summary" ] && python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[1], 'host_syncs_per_step', s.get('host_syncs_per_step'), 'mfu', s.get('mfu'))" "$summary"
done

if [ -d /usr/share/games/fortunes ] && [ "$build" = build ]; then
  step "the default job on the GPU: make run DEVICE=cuda NP=1"
  make run DEVICE=cuda NP=1 2>&1 | tail -15 || status=1
fi

step "done: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
