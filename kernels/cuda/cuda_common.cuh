// Shared by the CUDA kernels: error checks that name the call, rank, host, file and
// line; the element types (float, or bf16 under mixed precision) and their float
// conversions; the compute stream.
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_host.h"
#include "kernels/base/error.h"

namespace trident::kernels::cuda {

#define CUBLAS_CHECK(call) TRIDENT_CHECK_STATUS("cuBLAS", call, CUBLAS_STATUS_SUCCESS, cublasLt_status_name)

// Checks a kernel launch (configuration errors surface here, faults at the next sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

const char* cublasLt_status_name(cublasStatus_t status);

cublasLtHandle_t cublaslt_handle();
// cuBLAS's handle (the grouped GEMMs), on the compute stream.
cublasHandle_t cublas_handle();
int sm_count();

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

inline unsigned blocks_for(size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Sum / max over a warp (every lane gets the result).
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over a block of up to 1024 threads, in a fixed order (deterministic); every
// thread gets the result. `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  x = warp_sum(x);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(x);
}

}  // namespace trident::kernels::cuda
