// RMSNorm (Llama): out = x * rsqrt(mean(x^2) + eps) * weight, no mean, no bias.
#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps) {
#pragma omp parallel for
  for (int i = 0; i < N; i++) {
    const T* x = inp + static_cast<size_t>(i) * C;
    T* o = out + static_cast<size_t>(i) * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c] * x[c];
    const T s = T(1) / std::sqrt(sum / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    rstd[i] = s;
  }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C) {
  // With y = x s w and s = (mean(x^2) + eps)^-1/2: dx = s (w dy) - x s^3 <w dy, x> / C.
  // dweight sums over rows into per-thread partials added in thread order, so results
  // are the same bits run to run (as layernorm_backward).
  static std::vector<T> partials;
  const int threads = omp_get_max_threads();
  partials.assign(static_cast<size_t>(threads) * C, T(0));
#pragma omp parallel num_threads(threads)
  {
    T* dw_local = partials.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const T* x = inp + static_cast<size_t>(i) * C;
      const T* dy = dout + static_cast<size_t>(i) * C;
      T* dx = dinp + static_cast<size_t>(i) * C;
      const T s = rstd[i];
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; c++) {
        dot += weight[c] * dy[c] * x[c];
        dw_local[c] += x[c] * s * dy[c];
      }
      const T k = s * s * s * dot / C;
#pragma omp simd
      for (int c = 0; c < C; c++) dx[c] += s * weight[c] * dy[c] - x[c] * k;
    }
  }
  for (int th = 0; th < threads; th++) {
    const T* dw_local = partials.data() + static_cast<size_t>(th) * C;
    for (int c = 0; c < C; c++) dweight[c] += dw_local[c];
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int, int);

}  // namespace trident::kernels::cpu
