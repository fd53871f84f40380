#include <type_traits>

#include "bf16_gemm.h"
#include "cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// A linear layer's GEMM: in bf16 where the backend asked for it (bf16_gemm.h), else fp32.
template <typename T>
void linear_gemm(bool trans_a, bool trans_b, int M, int N, int K, const T* A, int lda, const T* B, int ldb, T beta,
                 T* C, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (Bf16Gemm* bf16 = LinearLayersInBf16::current()) {
      bf16->gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
      return;
    }
  }
  gemm<T>(trans_a, trans_b, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  // Write the bias first and let the GEMM add onto it (beta = 1): one pass over out.
  if (bias != nullptr) {
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
      T* o = out + static_cast<size_t>(i) * OC;
#pragma omp simd
      for (int j = 0; j < OC; j++) o[j] = bias[j];
    }
  }
  linear_gemm<T>(false, true, N, OC, C, inp, C, weight, C, bias != nullptr ? T(1) : T(0), out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC) {
  if (dinp != nullptr) linear_gemm<T>(false, false, N, C, OC, dout, OC, weight, C, T(0), dinp, C);
  if (dweight != nullptr) linear_gemm<T>(true, false, OC, C, N, dout, OC, inp, C, T(1), dweight, C);
  if (dbias != nullptr) {
    // Column sums, split over column blocks so each sum runs in one fixed order.
#pragma omp parallel for
    for (int j0 = 0; j0 < OC; j0 += 64) {
      const int j1 = j0 + 64 < OC ? j0 + 64 : OC;
      T sums[64] = {};
      for (int i = 0; i < N; i++) {
        const T* d = dout + static_cast<size_t>(i) * OC;
#pragma omp simd
        for (int j = j0; j < j1; j++) sums[j - j0] += d[j];
      }
      for (int j = j0; j < j1; j++) dbias[j] += sums[j - j0];
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int, int);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int, int, int);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*, const double*, int, int, int);

}  // namespace trident::kernels::cpu
