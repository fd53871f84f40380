# Sourced by check.sh (and tests/unit/test_gpu_scripts.sh): the build dependencies of the
# Makefile's CUDA build that this machine lacks, one a line; nothing when all are here.
missing_build_deps() {
  command -v mpicxx >/dev/null || echo "mpicxx (Open MPI)"
  pkg-config --exists hdf5 2>/dev/null || echo "HDF5 (pkg-config hdf5)"
  [ -f /usr/include/oneapi/dnnl/dnnl.h ] || echo "oneDNN (/usr/include/oneapi/dnnl/dnnl.h)"
  [ -f /usr/include/boost/program_options.hpp ] || echo "Boost.PO (/usr/include/boost/program_options.hpp)"
  [ -f /usr/include/gtest/gtest.h ] || echo "GoogleTest (/usr/include/gtest/gtest.h)"
  [ -f /usr/include/prometheus/text_serializer.h ] || echo "prometheus-cpp (/usr/include/prometheus/text_serializer.h)"
  [ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] || echo "libcurl (libcurl4-openssl-dev)"
  [ -f /usr/include/pugixml.hpp ] || echo "pugixml (/usr/include/pugixml.hpp)"
  command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || echo "nvcc"
}
