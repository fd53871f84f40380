#!/usr/bin/env bash
# What bf16 needs of verify's final-parameter tolerance (train/verify.h): every float64
# reference of tests/data verified in bf16 on one rank, with oneDNN's bf16 GEMMs where the CPU
# has them and emulated (DNNL_MAX_CPU_ISA=AVX512_CORE), and the bf16 layouts of the verify
# test; the largest final-parameter error of each kind of tensor over the runs that pass, and
# the runs that fail (the mixtures' routing flips under bf16: their references are checked
# in fp32, Mixtral's e4 in bf16 too).
# Usage: benchmarks/bf16_tolerance.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun="mpirun --oversubscribe -x OMP_NUM_THREADS=1"
for f in tests/data/*.h5; do
  for isa in ALL AVX512_CORE; do
    env DNNL_MAX_CPU_ISA=$isa "$build/trident" verify --reference "$f" --train.precision=bf16 \
      > "$out/$(basename "$f" .h5).$isa.txt" 2>&1
  done
done
i=0
while IFS='|' read -r np ref flags; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  $mpirun -np "$np" "$build/trident" verify --reference "tests/data/$ref" $flags --train.precision=bf16 \
    > "$out/layout$i.$(basename "$ref" .h5).txt" 2>&1 < /dev/null  # mpirun would read the list
done <<'LAYOUTS'
8|mixtral_ref_e4.h5|--parallel.tp=2 --parallel.pp=2 --parallel.ep=2 --train.micro_batch=1 --parallel.zero=1
8|mixtral_ref_e4.h5|--parallel.tp=2 --parallel.pp=2 --parallel.ep=2 --train.micro_batch=1 --parallel.zero=3
8|gpt2_ref_a.h5|--parallel.pp=2 --parallel.tp=2 --train.micro_batch=1
4|llama_ref_a.h5|--parallel.tp=4
8|llama_ref_a.h5|--parallel.pp=2 --parallel.tp=2 --train.micro_batch=1 --parallel.zero=1
6|llama_ref_h6_kv3_v101.h5|--parallel.tp=3 --parallel.zero=3 --train.micro_batch=1
8|llama_ref_a.h5|--parallel.zero=3 --parallel.shard_size=2 --parallel.tp=2 --train.micro_batch=1
2|gpt2_ref_a.h5|--parallel.tp=2 --parallel.sequence_parallel=true
8|llama_ref_l8.h5|--parallel.pp=4 --parallel.tp=2 --parallel.schedule=interleaved --parallel.vpp=2 --train.micro_batch=1
4|gpt2_ref_l8.h5|--parallel.pp=4 --parallel.schedule=zb1 --train.micro_batch=1
2|llama_ref_docs.h5|--parallel.pp=2 --parallel.schedule=zb1 --train.micro_batch=1
2|llama_ref_docs.h5|--parallel.cp=2 --train.recompute=selective
2|gpt2_ref_a.h5|--parallel.cp=2
2|qwen3_ref_t24.h5|--parallel.cp=2 --train.recompute=selective
4|qwen2_ref_t24.h5|--parallel.tp=4
4|gpt2_ref_t24.h5|--parallel.cp=4
LAYOUTS
python3 - "$out" <<'PY'
import glob, re, sys
worst, failed, runs = {}, [], 0
for path in sorted(glob.glob(sys.argv[1] + "/*.txt")):
    text, name = open(path).read(), path.rsplit("/", 1)[1][:-4]
    if "\nPASS" not in text:
        failed.append(name)
        continue
    runs += 1
    for m in re.finditer(r"^(\S+)\s+([0-9.e+-]+)\s+([0-9.e+-]+)$", text, re.M):
        t, err = m.group(1), float(m.group(3))
        kind = ("key biases (c_attn.bias, k_proj.bias)" if t.endswith(("c_attn.bias", "k_proj.bias")) else
                "other biases" if t.endswith("bias") else
                "norm gains" if "norm" in t or "ln_" in t else
                "experts" if ".experts." in t else
                "routers" if t.endswith("gate.weight") else
                "embeddings and heads" if t.startswith(("wte", "wpe", "lm_head")) or "embed" in t else
                "matrices")
        if err > worst.get(kind, (0, ""))[0]:
            worst[kind] = (err, t + " (" + name + ")")
print(f"{runs} bf16 verify runs passed; the largest final-parameter error of each kind:")
print(f"| kind | largest | where |\n| --- | ---: | --- |")
for kind, (err, where) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
    print(f"| {kind} | {err:.3e} | {where} |")
print("failed in bf16:", ", ".join(failed) if failed else "none")
PY
