#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>
#include <string>

#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <>
void gemm<float>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                          lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success)
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(status) + " (M=" +
                             std::to_string(M) + " N=" + std::to_string(N) + " K=" +
                             std::to_string(K) + ")");
}

// Plain triple loop: only the double-precision tests use it.
template <>
void gemm<double>(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                  int lda, const double* B, int ldb, double beta, double* C, int ldc) {
#pragma omp parallel for
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double sum = 0.0;
      for (int k = 0; k < K; k++) {
        const double a = trans_a ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b = trans_b ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        sum += a * b;
      }
      double& c = C[static_cast<size_t>(i) * ldc + j];
      c = alpha * sum + (beta == 0.0 ? 0.0 : beta * c);
    }
  }
}

}  // namespace trident::kernels::cpu
