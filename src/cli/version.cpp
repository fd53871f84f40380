#include "cli/version.h"

#include <hdf5.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <boost/version.hpp>
#include <cstdio>

#ifdef TRIDENT_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif
#ifdef TRIDENT_NCCL
#include <nccl.h>
#endif

namespace trident {

void print_version(const MpiWorld& world) {
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  const dnnl_version_t* dnnl = dnnl_version();
  std::printf("trident 0.1\n");
  std::printf("  compiler: %s, C++%ld\n", TRIDENT_CXX, __cplusplus / 100 % 100);
  std::printf("  MPI: %s\n", world.library_version().c_str());
  std::printf("  HDF5: %u.%u.%u\n", h5_major, h5_minor, h5_release);
  std::printf("  BLAS: oneDNN %d.%d.%d sgemm (%s), %d threads\n", dnnl->major, dnnl->minor,
              dnnl->patch, dnnl->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP runtime" : "other threading runtime",
              omp_get_max_threads());
  std::printf("  Boost: %d.%d\n", BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000);
  // CUDA and NCCL as the headers of the build named them: what the kernels were compiled
  // for (doctor reports the driver and the library a run actually loads).
#ifdef TRIDENT_CUDA
  // The runtime is linked in (statically): a driver older than this version cannot run the
  // build (benchmarks/gpu/check.sh compares). cuBLAS(Lt) .so.<major> is opened at run time.
  std::printf("  CUDA: built with %d.%d (runtime linked statically), cuBLAS %d.%d (libcublasLt.so.%d opened at run time)\n",
              CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_MAJOR);
#else
  std::printf("  CUDA: not built\n");
#endif
#ifdef TRIDENT_NCCL
  std::printf("  NCCL: built with %d.%d.%d%s\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_SUFFIX);
#else
  std::printf("  NCCL: not built\n");
#endif
}

}  // namespace trident
