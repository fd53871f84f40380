#!/usr/bin/env bash
# The CUDA sources compile against a cuBLAS header older than 12.5 (CUDA 12.0-12.4), which
# lacks cublasGemmGroupedBatchedEx: a shadow include folder holds a copy of this toolkit's
# cublas_api.h without that declaration (nor its _64 twin) and with the version set to 12.4,
# found before the toolkit's; every kernels/cuda/*.cu that includes cublas_library.h (itself
# or through a header) is compiled against it by the Makefile's own recipe (nvcc -c, its
# flags). Usage: tests/cuda/test_cublas_headers.sh
# Exit 0: pass; 1: fail; prints SKIP and exits 0 without nvcc.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=$(command -v nvcc || { [ -x "$cuda_home/bin/nvcc" ] && echo "$cuda_home/bin/nvcc"; })
[ -n "$nvcc" ] || { echo "SKIP: no nvcc"; exit 0; }
header=$(dirname "$nvcc")/../include/cublas_api.h
[ -f "$header" ] || header=$cuda_home/include/cublas_api.h
[ -f "$header" ] || { echo "FAIL: no cublas_api.h beside $nvcc or in $cuda_home/include"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/shadow" "$tmp/build"
# Each declaration is one statement from its name to the next ';'.
perl -0pe 's/cublasStatus_t\s+CUBLASWINAPI\s+cublasGemmGroupedBatchedEx(_64)?\s*\([^;]*\);//g;
           s/(#define CUBLAS_VER_MAJOR) \d+/$1 12/; s/(#define CUBLAS_VER_MINOR) \d+/$1 4/' \
  "$header" > "$tmp/shadow/cublas_api.h"
# A shadow that still declares it (a changed header layout) would pass whatever our code says.
if grep -q 'cublasGemmGroupedBatchedEx' "$tmp/shadow/cublas_api.h"; then
  echo "FAIL: could not remove cublasGemmGroupedBatchedEx from a copy of $header (its layout changed?)"
  exit 1
fi
grep -q 'cublasGemmGroupedBatchedEx' "$header" ||
  echo "note: $header itself lacks cublasGemmGroupedBatchedEx (an older toolkit): the shadow is the same"

# The sources that see the header: those including cublas_library.h, or a header that does.
includers=$(grep -l 'cublas_library\.h' kernels/cuda/*.h kernels/cuda/*.cuh 2>/dev/null | xargs -r -n1 basename)
sources=$(for f in kernels/cuda/*.cu; do
  for h in cublas_library.h $includers; do
    if grep -q "#include.*$h" "$f"; then echo "$f"; break; fi
  done
done)
[ -n "$sources" ] || { echo "FAIL: no kernels/cuda/*.cu includes cublas_library.h (renamed?)"; exit 1; }

status=0
for src in $sources; do
  obj=$tmp/build/${src%.cu}.o
  # The Makefile's rule for $obj, with -I shadow put first on nvcc's command line.
  if make -s BUILD="$tmp/build" NVCC="$nvcc -I$tmp/shadow" "$obj" > "$tmp/log" 2>&1 && [ -s "$obj" ]; then
    echo "ok: $src compiles against cuBLAS 12.4's declarations"
  else
    echo "FAIL: $src does not compile without cublasGemmGroupedBatchedEx in cublas_api.h:"
    grep -E 'error' "$tmp/log" | head -5
    status=1
  fi
done
exit $status
