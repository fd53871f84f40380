// cuBLASLt (every GEMM) and cuBLAS (the experts' grouped GEMMs), opened at run time (dlopen)
// on their first use in a CUDA run rather than linked.
// Linked, its static initializers cost every process ~0.4 s of CPU before main, CPU runs
// included (every rank of every mpirun, every test); opened, only --device=cuda pays, once.
// The entry points are the header's own declarations (decltype), so a changed signature
// fails to compile here, not at run time; all but cublasGemmGroupedBatchedEx, which cuBLAS
// declares from 12.5 only: spelled out below, so that CUDA 12.0-12.4 headers compile too
// (tests/cuda/test_cublas_headers.sh compiles against a header without it).
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>

#include <type_traits>

namespace trident::kernels::cuda {

// cublasGemmGroupedBatchedEx as cuBLAS 12.5+ declares it (cublas_api.h).
using GemmGroupedBatchedExFn = cublasStatus_t(CUBLASWINAPI*)(
    cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
    const int m_array[], const int n_array[], const int k_array[], const void* alpha_array,
    const void* const Aarray[], cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
    cudaDataType_t Btype, const int ldb_array[], const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
    const int ldc_array[], int group_count, const int group_size[], cublasComputeType_t computeType);
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
// Where the header declares it, the spelling must match (as decltype would).
static_assert(std::is_same_v<GemmGroupedBatchedExFn, decltype(&::cublasGemmGroupedBatchedEx)>,
              "cublasGemmGroupedBatchedEx's signature changed: update GemmGroupedBatchedExFn");
#endif

struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmul) Matmul;
  // gemm.cu's plan cache: an algorithm chosen for one shape checked on another, and the
  // descriptors of the plans it evicts destroyed.
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

struct Cublas {
  decltype(&::cublasCreate_v2) Create;
  decltype(&::cublasSetStream_v2) SetStream;
  GemmGroupedBatchedExFn GemmGroupedBatchedEx;  // null: no grouped GEMM (see cublas())
};

// libcublasLt.so.<the major version compiled against> (libcublas.so.<it>), found like a
// linked library (the binary's run path, LD_LIBRARY_PATH, the loader's cache). cuBLASLt is
// required: a missing library or entry point ends the run with one error naming it. cuBLAS
// is not: without it (or without its grouped GEMM, before 12.5) every entry is null, the
// experts run one GEMM each, and the first call says so once on stderr.
const CublasLt& cublaslt();
const Cublas& cublas();

}  // namespace trident::kernels::cuda
