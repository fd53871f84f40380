#!/usr/bin/env bash
# Packs what benchmarks/gpu/check.sh needs on a GPU machine that cannot install our build
# dependencies (Open MPI, HDF5, Boost.PO, oneDNN): the executables built here (with
# CUDA, by nvcc here) and every shared library they load that is not glibc or CUDA's,
# plus Open MPI's plugins and help files, relocated with OPAL_PREFIX.
#
#   bash benchmarks/gpu/bundle.sh      -> .gpu_bundle.tar.xz (about 21 MB; git ignores it)
#
# check.sh unpacks and uses it where mpicxx is missing. The CUDA libraries (cudart,
# cuBLASLt, NCCL) come from the GPU machine: they are large and tied to its driver. The
# libraries here need glibc 2.36 or newer (Debian 12, Ubuntu 24.04).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu_bundle
command -v nvcc >/dev/null || { echo "bundle.sh: needs nvcc here, to build the CUDA path"; exit 2; }
# A portable x86-64 baseline (AVX2), not this machine's -march=native.
build=build-bundle
make -j"$(nproc)" BUILD=$build ARCH_FLAGS=-march=x86-64-v3 $build/trident $build/bench/kernel_check >/dev/null
rm -rf "$out"
mkdir -p "$out/build/bench" "$out/lib"
cp $build/trident "$out/build/"
cp $build/bench/kernel_check "$out/build/bench/"
strip --strip-debug "$out/build/trident" "$out/build/bench/kernel_check"

ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$out/usr/lib/x86_64-linux-gnu" "$out/usr/share"
cp -r "$ompi_lib" "$out/usr/lib/x86_64-linux-gnu/"
rm -rf "$out/usr/lib/x86_64-linux-gnu/openmpi/include"
cp -r /usr/share/openmpi "$out/usr/share/"

# The libraries of the executables and of Open MPI's plugins, minus glibc and CUDA.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libcuda\.|libcudart\.|libcublas|libnccl\.)'
for f in "$out"/build/trident "$out"/build/bench/kernel_check "$out"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$out/lib/$name"
done
tar -cJf "$out.tar.xz" "$out"
rm -rf "$out"
ls -la "$out.tar.xz"
echo "bundle.sh: carry $out.tar.xz to the GPU machine and run there: bash benchmarks/gpu/check.sh"
