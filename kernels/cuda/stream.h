// The CUDA compute stream, for host code outside the kernels (the NCCL communicator
// orders its work after it). Plain C++: includable without nvcc.
#pragma once

#include <cuda_runtime.h>

namespace trident::kernels::cuda {

// The stream every kernel of this process runs on (made on first use, on the current device).
cudaStream_t compute_stream();

}  // namespace trident::kernels::cuda
