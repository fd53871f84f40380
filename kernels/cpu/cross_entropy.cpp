// Vocabulary-parallel softmax cross-entropy: per-shard partials that the caller combines
// over the tensor-parallel group (one shard when tp = 1).
#include <cmath>
#include <limits>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

template <typename T>
void logits_row_max(T* row_max, const T* logits, int N, int valid, int Vs) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const T* row = logits + static_cast<size_t>(i) * Vs;
    T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
    for (int j = 0; j < valid; j++) max = row[j] > max ? row[j] : max;
    row_max[i] = max;
  }
}

template <typename T>
void logits_sum_exp_and_target(T* sum_and_target, const T* logits, const T* row_max, const int32_t* targets,
                               int vocab_start, int N, int valid, int Vs) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const T* row = logits + static_cast<size_t>(i) * Vs;
    const T max = row_max[i];
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < valid; j++) sum += fast_exp(row[j] - max);
    sum_and_target[i] = sum;
    const int column = targets[i] - vocab_start;
    sum_and_target[N + i] = column >= 0 && column < valid ? row[column] : T(0);
  }
}

template <typename T>
void cross_entropy_loss(T* losses, T* lse, const T* row_max, const T* sum_and_target, int N) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    lse[i] = row_max[i] + std::log(sum_and_target[i]);
    losses[i] = lse[i] - sum_and_target[N + i];
  }
}

template <typename T>
void cross_entropy_backward(T* logits_to_dlogits, const T* lse, const int32_t* targets, int vocab_start, int N,
                            int valid, int Vs, T dloss) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    T* row = logits_to_dlogits + static_cast<size_t>(i) * Vs;
    const T l = lse[i];
#pragma omp simd
    for (int j = 0; j < valid; j++) row[j] = dloss * fast_exp(row[j] - l);
    for (int j = valid; j < Vs; j++) row[j] = 0;  // padded vocabulary takes no part
    const int column = targets[i] - vocab_start;
    if (column >= 0 && column < valid) row[column] -= dloss;
  }
}

template void logits_row_max<float>(float*, const float*, int, int, int);
template void logits_row_max<double>(double*, const double*, int, int, int);
template void logits_sum_exp_and_target<float>(float*, const float*, const float*, const int32_t*, int, int, int, int);
template void logits_sum_exp_and_target<double>(double*, const double*, const double*, const int32_t*, int, int, int, int);
template void cross_entropy_loss<float>(float*, float*, const float*, const float*, int);
template void cross_entropy_loss<double>(double*, double*, const double*, const double*, int);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, int, int, int, int, float);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, int, int, int, int, double);

}  // namespace trident::kernels::cpu
