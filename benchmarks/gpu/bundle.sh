#!/usr/bin/env bash
# Packs what benchmarks/gpu/check.sh needs on a GPU machine that cannot install our build
# dependencies (Open MPI, HDF5, Boost.PO, oneDNN): the executables built here (with
# CUDA, by nvcc here) and every shared library they load that is not glibc or CUDA's,
# plus Open MPI's plugins and help files, relocated with OPAL_PREFIX.
#
#   bash benchmarks/gpu/bundle.sh      -> .gpu_bundle.tar.xz (about 21 MB; git ignores it)
#
# check.sh unpacks and uses it where mpicxx is missing. The CUDA runtime is linked into
# the executables; cuBLAS(Lt) and NCCL come from the GPU machine (bundle_env.sh finds them:
# large, and tied to its driver); the bundle's cuda_version says which CUDA it needs. The
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
# The CUDA it was built with (major.minor), from the executable itself: bundle_env.sh looks
# for that major's cuBLAS, check.sh compares it with the driver's.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 $build/trident --version |
  sed -n 's/^  CUDA: built with \([0-9]*\.[0-9]*\).*/\1/p' > "$out/cuda_version"
grep -qE '^[0-9]+\.[0-9]+$' "$out/cuda_version" || { echo "bundle.sh: no CUDA version in trident --version"; exit 1; }

ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$out/usr/lib/x86_64-linux-gnu" "$out/usr/share"
cp -r "$ompi_lib" "$out/usr/lib/x86_64-linux-gnu/"
rm -rf "$out/usr/lib/x86_64-linux-gnu/openmpi/include"
cp -r /usr/share/openmpi "$out/usr/share/"

# The libraries of the executables and of Open MPI's plugins, minus glibc's and CUDA's.
# glibc's own libraries (libresolv, libnss_*, ... beside libc) use GLIBC_PRIVATE symbols
# of the libc they were built with: bundled, they fail to load on another glibc. Whether
# a file is glibc's: its dpkg package (libc6) where dpkg knows the file, else its name.
# libcrypt.so.1 (libxcrypt) and libnsl.so.2 (libnsl2) are not glibc's on Debian.
glibc_names='^(ld-linux.*|libc|libm|libmvec|libdl|librt|libpthread|libresolv|libutil|libanl|libBrokenLocale|libthread_db|libc_malloc_debug|libmemusage|libpcprofile|libcidn|libSegFault)\.so(\..*)?$|^libnss_|^libnsl\.so\.1$'
is_glibc() {  # name, path
  local owner
  if command -v dpkg >/dev/null; then
    for p in "$2" "$(readlink -f "$2")"; do
      owner=$(dpkg -S "$p" 2>/dev/null | head -1) && [ -n "$owner" ] || continue
      [[ ${owner%%: *} =~ ^libc6(-(i386|x32|amd64))?(:[a-z0-9]+)?$ ]]
      return
    done
  fi
  [[ $1 =~ $glibc_names ]]
}
cuda_names='^(libcuda\.|libcudart\.|libcublas|libnccl\.)'
for f in "$out"/build/trident "$out"/build/bench/kernel_check "$out"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $cuda_names ]]; then continue; fi
  if is_glibc "$name" "$path"; then echo "bundle.sh: not bundled (glibc): $name"; continue; fi
  cp -L "$path" "$out/lib/$name"
done

# No bundled file may use glibc's private interface (it would tie the bundle to this glibc).
dynsyms() { if command -v objdump >/dev/null; then objdump -T "$1"; else readelf --dyn-syms -W "$1"; fi 2>/dev/null; }
private=0
while IFS= read -r -d '' f; do
  if dynsyms "$f" | grep GLIBC_PRIVATE >/dev/null; then  # not -q: a closed pipe would fail it under pipefail
    echo "bundle.sh: $f uses GLIBC_PRIVATE symbols"
    private=1
  fi
done < <(find "$out/lib" "$out/build" "$out/usr/lib" -type f \( -name '*.so*' -o -perm -u+x \) -print0)
[ $private = 0 ] || { echo "bundle.sh: glibc's private symbols in the bundle; not packed"; exit 1; }
tar -cJf "$out.tar.xz" "$out"
rm -rf "$out"
ls -la "$out.tar.xz"
echo "bundle.sh: carry $out.tar.xz to the GPU machine and run there: bash benchmarks/gpu/check.sh"
