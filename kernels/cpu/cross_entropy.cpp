#include <cmath>
#include <limits>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

namespace {

// Returns log(sum(exp(row[:V] - max))) + max, the log of the softmax's denominator.
template <typename T>
T log_sum_exp(const T* row, int V) {
  T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
  for (int j = 0; j < V; j++) max = row[j] > max ? row[j] : max;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) sum += fast_exp(row[j] - max);
  return std::log(sum) + max;
}

}  // namespace

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const T* row = logits + static_cast<size_t>(i) * Vp;
    losses[i] = log_sum_exp(row, V) - row[targets[i]];
  }
}

template <typename T>
void cross_entropy_backward(T* losses, T* logits_to_dlogits, const int32_t* targets, int N, int V,
                            int Vp, T dloss) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    T* row = logits_to_dlogits + static_cast<size_t>(i) * Vp;
    const T lse = log_sum_exp(row, V);
    const int target = targets[i];
    losses[i] = lse - row[target];
#pragma omp simd
    for (int j = 0; j < V; j++) row[j] = dloss * fast_exp(row[j] - lse);
    row[target] -= dloss;
    for (int j = V; j < Vp; j++) row[j] = 0;  // padded vocabulary takes no part
  }
}

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int, int, int);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int, int, int);
template void cross_entropy_backward<float>(float*, float*, const int32_t*, int, int, int, float);
template void cross_entropy_backward<double>(double*, double*, const int32_t*, int, int, int, double);

}  // namespace trident::kernels::cpu
