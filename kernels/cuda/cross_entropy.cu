// Softmax cross-entropy over a vocabulary shard, from per-shard partials (the caller
// combines them over tensor-parallel ranks): one block per row for the reductions, the
// loss and the in-place gradient. The full softmax is never stored.
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void row_max_kernel(float* row_max, const T* logits, int valid, int Vs) {
  __shared__ float shared[32];
  const T* row = logits + static_cast<size_t>(blockIdx.x) * Vs;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, to_float(row[j]));
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T>
__global__ void sum_exp_and_target_kernel(float* sum_and_target, const T* logits, const float* row_max,
                                          const int32_t* targets, int vocab_start, int N, int valid, int Vs) {
  __shared__ float shared[32];
  const int i = blockIdx.x;
  const T* row = logits + static_cast<size_t>(i) * Vs;
  const float m = row_max[i];
  float sum = 0.0f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += __expf(to_float(row[j]) - m);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const int target = targets[i] - vocab_start;
    sum_and_target[i] = sum;
    sum_and_target[N + i] = target >= 0 && target < valid ? to_float(row[target]) : 0.0f;
  }
}

__global__ void loss_kernel(float* losses, float* lse, const float* row_max, const float* sum_and_target, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  lse[i] = row_max[i] + logf(sum_and_target[i]);
  losses[i] = lse[i] - sum_and_target[N + i];
}

template <typename T>
__global__ void backward_kernel(T* logits, const float* lse, const int32_t* targets, int vocab_start, int valid,
                                int Vs, float dloss) {
  const int i = blockIdx.x;
  T* row = logits + static_cast<size_t>(i) * Vs;
  const float row_lse = lse[i];
  const int target = targets[i] - vocab_start;
  for (int j = threadIdx.x; j < Vs; j += blockDim.x) {
    const float p = j < valid ? __expf(to_float(row[j]) - row_lse) : 0.0f;
    row[j] = from_float<T>(j < valid ? dloss * (p - (j == target ? 1.0f : 0.0f)) : 0.0f);
  }
}

}  // namespace

template <typename T>
void logits_row_max(float* row_max, const T* logits, int N, int valid, int Vs) {
  if (N > 0) row_max_kernel<T><<<N, kThreads, 0, compute_stream()>>>(row_max, logits, valid, Vs);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void logits_sum_exp_and_target(float* sum_and_target, const T* logits, const float* row_max, const int32_t* targets,
                               int vocab_start, int N, int valid, int Vs) {
  if (N > 0)
    sum_exp_and_target_kernel<T><<<N, kThreads, 0, compute_stream()>>>(sum_and_target, logits, row_max, targets,
                                                                        vocab_start, N, valid, Vs);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target, int N) {
  if (N > 0) loss_kernel<<<blocks_for(N, 256), 256, 0, compute_stream()>>>(losses, lse, row_max, sum_and_target, N);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_backward(T* logits_to_dlogits, const float* lse, const int32_t* targets, int vocab_start, int N,
                            int valid, int Vs, float dloss) {
  if (N > 0)
    backward_kernel<T><<<N, kThreads, 0, compute_stream()>>>(logits_to_dlogits, lse, targets, vocab_start, valid, Vs,
                                                             dloss);
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                              \
  template void logits_row_max<T>(float*, const T*, int, int, int);                                        \
  template void logits_sum_exp_and_target<T>(float*, const T*, const float*, const int32_t*, int, int, int, int); \
  template void cross_entropy_backward<T>(T*, const float*, const int32_t*, int, int, int, int, float);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)

}  // namespace trident::kernels::cuda
