// cuBLASLt (every GEMM) and cuBLAS (the experts' grouped GEMMs), opened at run time (dlopen)
// on their first use in a CUDA run rather than linked.
// Linked, its static initializers cost every process ~0.4 s of CPU before main, CPU runs
// included (every rank of every mpirun, every test); opened, only --device=cuda pays, once.
// The entry points are the header's own declarations (decltype), so a changed signature
// fails to compile here, not at run time.
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>

namespace trident::kernels::cuda {

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
  decltype(&::cublasGemmGroupedBatchedEx) GemmGroupedBatchedEx;  // null before cuBLAS 12.5
};

// libcublasLt.so.<the major version compiled against> (libcublas.so.<it>), found like a
// linked library (the binary's run path, LD_LIBRARY_PATH, the loader's cache). A missing
// library or entry point ends the run with one error naming it.
const CublasLt& cublaslt();
const Cublas& cublas();

}  // namespace trident::kernels::cuda
