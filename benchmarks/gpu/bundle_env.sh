# Sourced by check.sh: the environment that runs a bundle made by bundle.sh.
# $1: the bundle directory. TRIDENT_LIB_ROOT (tests): a directory standing for / in the
# search for CUDA's libraries below (ldconfig is then not asked).
# Sets BUNDLE_CUDA_VERSION (major.minor of the CUDA the bundle was built with: its file
# cuda_version, written by bundle.sh) for check.sh's comparison with the driver.
bundle=$(cd "$1" && pwd)
BUNDLE_CUDA_VERSION=$(cat "$bundle/cuda_version" 2>/dev/null)
if ! [[ $BUNDLE_CUDA_VERSION =~ ^[0-9]+\.[0-9]+$ ]]; then
  echo "bundle_env.sh: $bundle/cuda_version missing or not major.minor (a bundle older than it): CUDA 13.0 assumed"
  BUNDLE_CUDA_VERSION=13.0
fi
glibc=$(ldd --version | head -1 | grep -o '[0-9]*\.[0-9]*$')
if [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | head -1)" != 2.36 ]; then
  echo "bundle_env.sh: this machine has glibc $glibc; the bundle's libraries need 2.36 (make it on an older distribution)"
fi
export OPAL_PREFIX=$bundle/usr                # Open MPI finds its plugins and help files here
export OMPI_MCA_ess_singleton_isolated=1      # one rank, no mpirun: no support daemon to start
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ld_path=$bundle/lib:$bundle/usr/lib/x86_64-linux-gnu/openmpi/lib

# CUDA's libraries come from this machine: the toolkit's, the system's, or a Python
# environment's wheels (nvidia-*: site-packages/nvidia/*/lib), on whatever mount. Searched
# in this order; the first found is used.
bundle_lib_places() {  # "dir D", "find D" (a tree) or "ldconfig", one a line, in search order
  local r=${TRIDENT_LIB_ROOT:-} home=${HOME:-/root} d sites=()
  for d in ${CUDA_HOME:-} ${NCCL_HOME:-}; do printf 'dir %s\n' "$r$d/lib64" "$r$d/lib"; done
  printf 'dir %s\n' "$r"/usr/local/cuda/lib64 "$r"/usr/local/cuda*/lib64 "$r"/usr/local/cuda*/targets/x86_64-linux/lib
  printf 'dir %s\n' "$r"/usr/lib/x86_64-linux-gnu "$r"/lib/x86_64-linux-gnu "$r"/usr/lib64 "$r"/usr/local/lib
  [ -n "$r" ] || echo ldconfig
  printf 'find %s\n' "$r"/opt/nvidia  # the HPC SDK: a deep tree of versions
  if [ -z "$r" ] && command -v python3 >/dev/null; then  # this environment's Python (venv, conda) first
    mapfile -t sites < <(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  fi
  for d in ${VIRTUAL_ENV:-} ${CONDA_PREFIX:-}; do sites+=("$r$d"/lib/python3*/site-packages); done
  for d in "$r"/opt/conda "$r"/opt/conda/envs/* "$r$home/.local" "$r"/usr/local "$r"/usr; do
    sites+=("$d"/lib/python3*/site-packages "$d"/lib/python3*/dist-packages)
  done
  sites+=("$r"/usr/lib/python3/dist-packages)
  for d in "${sites[@]}"; do printf 'dir %s\n' "$d"/nvidia/*/lib "$d"/nvidia/*/lib64; done
  for d in ${CONDA_PREFIX:-}; do printf 'dir %s\n' "$r$d/lib"; done
  printf 'dir %s\n' "$r"/opt/conda/lib "$r"/opt/conda/envs/*/lib "$r$home/.local/lib"
}
bundle_find_lib() {  # name: prints the file's path, or nothing
  local kind d found
  while read -r kind d; do
    found=
    case $kind in
      dir) [ -e "$d/$1" ] && found=$d/$1 ;;
      find) [ -d "$d" ] && found=$(find "$d" -name "$1" 2>/dev/null | sort -r | head -1) ;;
      ldconfig) found=$({ command -v ldconfig >/dev/null && ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null |
                          awk -v lib="$1" '$1 == lib && /x86-64/ {print $NF}' | head -1) ;;
    esac
    if [ -n "$found" ]; then
      echo "$found"
      return
    fi
  done < <(bundle_lib_places)
}
# The CUDA runtime is linked into the executables (no libcudart.so); cuBLASLt and cuBLAS
# of the bundle's CUDA major are opened at run time (cuBLAS for the experts' grouped GEMM
# alone: without it they run a GEMM each), NCCL is linked.
cuda_major=${BUNDLE_CUDA_VERSION%%.*}
for lib in libcublasLt.so.$cuda_major libcublas.so.$cuda_major libnccl.so.2; do
  found=$(bundle_find_lib "$lib")
  if [ -z "$found" ]; then
    echo "bundle_env.sh: $lib not found (the toolkit, the system, ldconfig, /opt/nvidia, Python's nvidia-* wheels, conda)"
    continue
  fi
  echo "bundle_env.sh: $lib: $found"
  dir=$(dirname "$found")
  case "$dir" in  # the loader searches these anyway
    /lib/x86_64-linux-gnu | /usr/lib/x86_64-linux-gnu | /lib64 | /usr/lib64) ;;
    *) [[ :$ld_path: == *:$dir:* ]] || ld_path=$ld_path:$dir ;;
  esac
done
unset -f bundle_lib_places bundle_find_lib
unset cuda_major
export LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
