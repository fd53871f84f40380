// Host-side CUDA helpers shared by the kernels and the code around them (the NCCL
// communicator): the checked call and the compute stream. Plain C++: includable
// without nvcc.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/error.h"

// Checks a library call that returns a status: `ok` is its success value, `describe`
// names a status. fail() adds the host, file and line, and the caller's catch the rank.
#define TRIDENT_CHECK_STATUS(library, call, ok, describe)                                          \
  do {                                                                                             \
    const auto trident_status_ = (call);                                                           \
    if (trident_status_ != (ok))                                                                   \
      ::trident::fail(std::string(library ": ") + describe(trident_status_) + " in " + #call);     \
  } while (0)

#define CUDA_CHECK(call) TRIDENT_CHECK_STATUS("CUDA", call, cudaSuccess, cudaGetErrorString)

namespace trident::kernels::cuda {

// The stream every kernel of this process runs on (made on first use, on the current
// device); communication runs on streams of its own, ordered after it with events.
cudaStream_t compute_stream();

}  // namespace trident::kernels::cuda
