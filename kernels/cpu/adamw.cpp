#include <cmath>

#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, size_t n, T lr, T beta1, T beta2, T eps,
                  T weight_decay, int t, T grad_scale) {
  const T bias1 = T(1) - std::pow(beta1, T(t));
  const T bias2 = T(1) - std::pow(beta2, T(t));
  const T decay = T(1) - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const T g = grad[i] * grad_scale;
    const T mi = beta1 * m[i] + (T(1) - beta1) * g;
    const T vi = beta2 * v[i] + (T(1) - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    // PyTorch's order: decay first, then the Adam step.
    param[i] = param[i] * decay - lr * (mi / bias1) / (std::sqrt(vi / bias2) + eps);
  }
}

namespace {

// Fixed-size blocks summed in order: the same result for any thread count.
template <bool kSquares, typename T>
double block_sum(const T* x, size_t n) {
  constexpr size_t kBlock = 1 << 14;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  double total = 0.0;
#pragma omp parallel for ordered schedule(static)
  for (size_t b = 0; b < blocks; b++) {
    const size_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = b * kBlock; i < end; i++) s += kSquares ? static_cast<double>(x[i]) * x[i] : static_cast<double>(x[i]);
#pragma omp ordered
    total += s;
  }
  return total;
}

}  // namespace

template <typename T>
double sum_squares(const T* x, size_t n) {
  return block_sum<true>(x, n);
}

double sum(const float* x, size_t n) { return block_sum<false>(x, n); }

template void adamw_update<float>(float*, const float*, float*, float*, size_t, float, float, float, float, float, int, float);
template void adamw_update<double>(double*, const double*, double*, double*, size_t, double, double, double, double, double, int, double);
template double sum_squares<float>(const float*, size_t);
template double sum_squares<double>(const double*, size_t);

}  // namespace trident::kernels::cpu
