#!/usr/bin/env bash
# The GPU check's shell helpers, without a GPU, on fake trees in a temporary directory:
#   benchmarks/gpu/bundle_env.sh finds CUDA's libraries (cuBLASLt, cuBLAS of the bundle's
#     CUDA major, NCCL) in a Python environment's
#     nvidia-* wheels (site-packages/nvidia/*/lib) and under CUDA_HOME, says where, puts
#     their directories on LD_LIBRARY_PATH, and says which it did not find;
#   benchmarks/gpu/build_deps.sh reports a missing build dependency even where mpicxx
#     and nvcc are there (check.sh then uses the bundle);
#   benchmarks/gpu/check_lib.sh's driver check stops a build newer than the driver.
# Prints "PASS" or "FAIL: ..." lines; exit 0 when all pass.
# Usage: bash tests/unit/test_gpu_scripts.sh   (from the repository root)
set -uo pipefail
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# ---- bundle_env.sh: a fake / with NCCL in a conda environment's wheel, cuBLASLt in the
# user's site-packages, cuBLAS under CUDA_HOME; a decoy cuBLAS later in the order. The
# bundle says it was built with CUDA 13.0 (its cuda_version); the .so.12 ones are decoys.
root=$tmp/root
nccl_dir=$root/opt/conda/envs/train/lib/python3.11/site-packages/nvidia/nccl/lib
cublaslt_dir=$root/home/u/.local/lib/python3.12/site-packages/nvidia/cu13/lib
cublas_dir=$root/opt/cuda-13/lib64
mkdir -p "$nccl_dir" "$cublaslt_dir" "$cublas_dir" "$root/usr/local/lib" "$tmp/bundle"
touch "$nccl_dir/libnccl.so.2" "$cublaslt_dir/libcublasLt.so.13" "$cublas_dir/libcublas.so.13" \
  "$root/usr/local/lib/libcublas.so.13" "$root/usr/local/lib/libcublasLt.so.12" "$root/usr/local/lib/libcublas.so.12"
echo 13.0 > "$tmp/bundle/cuda_version"
run_env() {  # extra environment...: the output and the resulting LD_LIBRARY_PATH
  env -u CUDA_HOME -u NCCL_HOME -u VIRTUAL_ENV -u CONDA_PREFIX -u LD_LIBRARY_PATH HOME=/home/u \
    TRIDENT_LIB_ROOT="$root" "$@" bash -c \
    'set -uo pipefail; source "$0"/benchmarks/gpu/bundle_env.sh "$1"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; echo "BUNDLE_CUDA_VERSION=$BUNDLE_CUDA_VERSION"' \
    "$repo" "$tmp/bundle" 2>&1
}
out=$(run_env CUDA_HOME=/opt/cuda-13)
echo "$out" | sed 's/^/  | /'
ld=$(echo "$out" | sed -n 's/^LD_LIBRARY_PATH=//p')
expect "libnccl.so.2 found in a conda environment's nvidia-nccl wheel" grep -qxF "bundle_env.sh: libnccl.so.2: $nccl_dir/libnccl.so.2" <<< "$out"
expect "libcublasLt.so.13 found in ~/.local's site-packages" grep -qxF "bundle_env.sh: libcublasLt.so.13: $cublaslt_dir/libcublasLt.so.13" <<< "$out"
expect "libcublas.so.13 found under CUDA_HOME first" grep -qxF "bundle_env.sh: libcublas.so.13: $cublas_dir/libcublas.so.13" <<< "$out"
expect "no libcudart.so looked for (linked statically)" bash -c '! grep -q libcudart <<< "$0"' "$out"
expect "the bundle's CUDA version read from its cuda_version" grep -qxF "BUNDLE_CUDA_VERSION=13.0" <<< "$out"
expect "the bundle's libraries first on LD_LIBRARY_PATH" [ "${ld%%:*}" = "$tmp/bundle/lib" ]
for d in "$nccl_dir" "$cublaslt_dir" "$cublas_dir"; do
  expect "${d#"$root"} on LD_LIBRARY_PATH" grep -q ":$d\(:\|$\)" <<< "$ld"
done
rm "$nccl_dir/libnccl.so.2"
out=$(run_env)
expect "a missing libnccl.so.2 reported" grep -q "^bundle_env.sh: libnccl.so.2 not found" <<< "$out"
expect "without CUDA_HOME, libcublas.so.13 from /usr/local/lib" grep -qxF "bundle_env.sh: libcublas.so.13: $root/usr/local/lib/libcublas.so.13" <<< "$out"
# A bundle built with CUDA 12.8 looks for the .so.12 ones.
echo 12.8 > "$tmp/bundle/cuda_version"
out=$(run_env)
expect "a CUDA 12.8 bundle finds libcublasLt.so.12" grep -qxF "bundle_env.sh: libcublasLt.so.12: $root/usr/local/lib/libcublasLt.so.12" <<< "$out"
expect "a CUDA 12.8 bundle finds libcublas.so.12" grep -qxF "bundle_env.sh: libcublas.so.12: $root/usr/local/lib/libcublas.so.12" <<< "$out"

# ---- build_deps.sh: mpicxx and nvcc here, pkg-config (HDF5) not.
mkdir -p "$tmp/bin"
for tool in mpicxx nvcc; do printf '#!/bin/sh\n' > "$tmp/bin/$tool"; chmod +x "$tmp/bin/$tool"; done
missing=$(PATH=$tmp/bin CUDA_HOME=$tmp/none "$BASH" -c 'source "$0"/benchmarks/gpu/build_deps.sh; missing_build_deps' "$repo")
echo "$missing" | sed 's/^/  | missing: /'
expect "HDF5 missing where mpicxx is there" grep -q "^HDF5" <<< "$missing"
expect "mpicxx and nvcc not reported missing" bash -c '! grep -qE "^(mpicxx|nvcc)" <<< "$0"' "$missing"
missing=$(PATH=$tmp/none CUDA_HOME=$tmp/none "$BASH" -c 'source "$0"/benchmarks/gpu/build_deps.sh; missing_build_deps' "$repo")
expect "mpicxx and nvcc reported missing without them" bash -c '[ "$(grep -cE "^(mpicxx|nvcc)" <<< "$0")" = 2 ]' "$missing"

# ---- check_lib.sh's driver check: one line, exit 2, where the driver is older than the build.
driver() { bash -c 'source "$0"/benchmarks/gpu/check_lib.sh; check_driver "$1" "$2"' "$repo" "$@"; }
out=$(driver 13.0 12.4)
expect "a 12.4 driver refuses a 13.0 build with exit 2" [ $? = 2 ]
expect "in one line naming both versions" [ "$out" = "the driver supports CUDA 12.4; this build needs CUDA 13.0: update the driver, or build with a CUDA 12.4 toolkit (make CUDA_HOME=...)" ]
expect "a 13.0 build on a 13.1 driver goes on" driver 13.0 13.1
driver 12.10 12.9 > /dev/null
expect "a 12.10 build on a 12.9 driver refused (versions, not decimals)" [ $? = 2 ]
expect "a 12.9 build on a 12.10 driver goes on" driver 12.9 12.10

[ $failures = 0 ] && echo PASS || echo "FAIL: $failures checks"
[ $failures = 0 ]
