# Sourced by check.sh: the environment that runs a bundle made by bundle.sh.
# $1: the bundle directory.
bundle=$(cd "$1" && pwd)
glibc=$(ldd --version | head -1 | grep -o '[0-9]*\.[0-9]*$')
if [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | head -1)" != 2.36 ]; then
  echo "bundle_env.sh: this machine has glibc $glibc; the bundle's libraries need 2.36 (make it on an older distribution)"
fi
export OPAL_PREFIX=$bundle/usr                # Open MPI finds its plugins and help files here
export OMPI_MCA_ess_singleton_isolated=1      # one rank, no mpirun: no support daemon to start
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ld_path=$bundle/lib:$bundle/usr/lib/x86_64-linux-gnu/openmpi/lib
# CUDA's libraries from this machine: the toolkit's, else the Python wheels' (nvidia-*).
for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
  if [ ! -e "/usr/local/cuda/lib64/$lib" ] && ! ldconfig -p | grep -q "$lib"; then
    found=$(find / -xdev -name "$lib" -path "*nvidia*" 2>/dev/null | head -1)
    [ -n "$found" ] && ld_path=$ld_path:$(dirname "$found")
  fi
done
export LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
