// The per-process CUDA state: device choice, the compute stream, the cuBLASLt handle.
#include "../kernels.h"
#include "cublas_library.h"
#include "cuda_common.cuh"

namespace trident::kernels {

bool cuda_compiled_in() { return true; }

int cuda_device_count() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

void select_cuda_device(int local_rank) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  require(e == cudaSuccess && devices > 0,
          std::string("device cuda: no usable GPU on this machine (") +
              (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  CUDA_CHECK(cudaSetDevice(local_rank % devices));
}

}  // namespace trident::kernels

namespace trident::kernels::cuda {

const char* cublasLt_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

cudaStream_t compute_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

cublasLtHandle_t cublaslt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h;
    CUBLAS_CHECK(cublaslt().Create(&h));
    return h;
  }();
  return handle;
}

cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublas().Create(&h));
    CUBLAS_CHECK(cublas().SetStream(h, compute_stream()));
    return h;
  }();
  return handle;
}

int sm_count() {
  static int count = [] {
    int device = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

}  // namespace trident::kernels::cuda
