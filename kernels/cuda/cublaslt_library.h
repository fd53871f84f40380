// cuBLASLt, opened at run time (dlopen) on the first GEMM of a CUDA run rather than linked.
// Linked, its static initializers cost every process ~0.4 s of CPU before main, CPU runs
// included (every rank of every mpirun, every test); opened, only --device=cuda pays, once.
// The entry points are the header's own declarations (decltype), so a changed signature
// fails to compile here, not at run time.
#pragma once

#include <cublasLt.h>

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
};

// libcublasLt.so.<the major version compiled against>, found like a linked library (the
// binary's run path, LD_LIBRARY_PATH, the loader's cache). A missing library or entry point
// ends the run with one error naming it.
const CublasLt& cublaslt();

}  // namespace trident::kernels::cuda
