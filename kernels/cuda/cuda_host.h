// Host-side CUDA helpers shared by the kernels and the code around them (the NCCL
// communicator): the checked call and the compute stream. Plain C++: includable
// without nvcc.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "runtime/error.h"

// Checks a CUDA runtime call; fail() adds the host, file and line, and the caller's
// catch the rank.
#define CUDA_CHECK(call)                                                                                \
  do {                                                                                                  \
    const cudaError_t cuda_check_error_ = (call);                                                       \
    if (cuda_check_error_ != cudaSuccess)                                                               \
      ::trident::fail(std::string("CUDA: ") + cudaGetErrorString(cuda_check_error_) + " in " + #call); \
  } while (0)

namespace trident::kernels::cuda {

// The stream every kernel of this process runs on (made on first use, on the current
// device); communication runs on streams of its own, ordered after it with events.
cudaStream_t compute_stream();

}  // namespace trident::kernels::cuda
