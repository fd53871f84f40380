#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                       int C, T eps) {
#pragma omp parallel for
  for (int i = 0; i < N; i++) {
    const T* x = inp + static_cast<size_t>(i) * C;
    T* o = out + static_cast<size_t>(i) * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    const T m = sum / C;
    T var = 0;  // two passes: the one-pass formula loses digits when |mean| >> std
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    const T s = T(1) / std::sqrt(var / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C) {
  // dinp: rows are independent. dweight/dbias: sums over rows; each thread adds into
  // its own partial, and the partials are added in thread order so that results are
  // identical run to run (resumed runs must match bit for bit).
  static std::vector<T> partials;  // shared by the threads; reused across calls
  const int threads = omp_get_max_threads();
  partials.assign(static_cast<size_t>(threads) * 2 * C, T(0));
#pragma omp parallel num_threads(threads)
  {
    T* dw_local = partials.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    T* db_local = dw_local + C;
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const T* x = inp + static_cast<size_t>(i) * C;
      const T* dy = dout + static_cast<size_t>(i) * C;
      T* dx = dinp + static_cast<size_t>(i) * C;
      const T m = mean[i], s = rstd[i];
      T sum_dnorm = 0, sum_dnorm_xhat = 0;
#pragma omp simd reduction(+ : sum_dnorm, sum_dnorm_xhat)
      for (int c = 0; c < C; c++) {
        const T xhat = (x[c] - m) * s;
        const T dnorm = weight[c] * dy[c];
        sum_dnorm += dnorm;
        sum_dnorm_xhat += dnorm * xhat;
        db_local[c] += dy[c];
        dw_local[c] += xhat * dy[c];
      }
      const T mean_dnorm = sum_dnorm / C, mean_dnorm_xhat = sum_dnorm_xhat / C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const T xhat = (x[c] - m) * s;
        dx[c] += (weight[c] * dy[c] - mean_dnorm - xhat * mean_dnorm_xhat) * s;
      }
    }
  }
  for (int th = 0; th < threads; th++) {
    const T* dw_local = partials.data() + static_cast<size_t>(th) * 2 * C;
    for (int c = 0; c < C; c++) {
      dweight[c] += dw_local[c];
      dbias[c] += dw_local[C + c];
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, float);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int, int, double);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*, const double*, const double*, int, int);

}  // namespace trident::kernels::cpu
