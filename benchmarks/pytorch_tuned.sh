#!/usr/bin/env bash
# Runs CMD as "tuned PyTorch" (shared/MACHINE.md): tcmalloc preloaded, Debian's OpenMP
# OpenBLAS in place of whatever libblas.so.3 / liblapack.so.3 the system selects (for this
# process only: LD_LIBRARY_PATH), OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (the
# environment's Haswell/512 settings are for this command alone lifted), so OpenBLAS runs
# the kernels of this CPU. Installs nothing: a missing package is named, exit code 2.
#
#   benchmarks/pytorch_tuned.sh /usr/bin/python3 benchmarks/pytorch_llama.py --layers 12 ...
#
# OpenBLAS 0.3.21 picks its kernels from the CPU model; a model newer than it knows (e.g.
# Intel family 6 model 207, Emerald Rapids) falls back to Prescott (SSE3), several times
# slower. Then, and only then, the kernels matching the CPU's instruction set are named:
# SkylakeX with AVX-512 (F, CD, BW, DQ, VL), Haswell with AVX2 + FMA. PYTORCH_TUNED_CORETYPE
# overrides that choice (a core name, or "auto" for OpenBLAS's own, whatever it is).
# What was chosen goes to stderr; the peers print what they really loaded in their row.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: benchmarks/pytorch_tuned.sh CMD [ARGS...]" >&2
  exit 2
fi
libdir=/usr/lib/x86_64-linux-gnu
tcmalloc=$libdir/libtcmalloc_minimal.so.4
openblas=$libdir/openblas-openmp
missing=()
[ -e "$tcmalloc" ] || missing+=(libtcmalloc-minimal4)
[ -e "$openblas/libblas.so.3" ] && [ -e "$openblas/libopenblas.so.0" ] || missing+=(libopenblas0-openmp)
if [ ${#missing[@]} -gt 0 ]; then
  echo "pytorch_tuned.sh: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 2
fi
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

corename() {  # the kernels OpenBLAS picks under the current environment
  /usr/bin/python3 -c "import ctypes; l = ctypes.CDLL('$openblas/libopenblas.so.0')
l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())" 2>/dev/null || echo unknown
}
auto=$(corename)
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
want=${PYTORCH_TUNED_CORETYPE:-}
if [ -z "$want" ]; then
  want=auto
  if has avx512f avx512cd avx512bw avx512dq avx512vl; then
    case $auto in SkylakeX | Cooperlake | SapphireRapids) ;; *) want=SkylakeX ;; esac
  elif has avx2 fma; then
    case $auto in Haswell | Zen | SkylakeX | Cooperlake | SapphireRapids) ;; *) want=Haswell ;; esac
  fi
fi
if [ "$want" != auto ]; then
  export OPENBLAS_CORETYPE=$want
  echo "pytorch_tuned.sh: tcmalloc, OpenMP OpenBLAS; OpenBLAS picks $auto kernels on this CPU on its own, using $(corename) (OPENBLAS_CORETYPE=$want)" >&2
else
  echo "pytorch_tuned.sh: tcmalloc, OpenMP OpenBLAS, its own choice of kernels: $auto" >&2
fi
export LD_PRELOAD=$tcmalloc${LD_PRELOAD:+:$LD_PRELOAD}
export LD_LIBRARY_PATH=$openblas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
exec "$@"
