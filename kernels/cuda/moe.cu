// Mixture of experts: the router's softmax (or sigmoid) and top-k (a warp per token: its
// lanes stride over the E experts, reductions and the top-k's argmax by warp shuffles, so
// no per-thread array sized by E), and the tokens' dispatch to their experts' rows and
// the weighted combination back (a thread per element; each output element is written by
// one thread, so no atomics). Semantics: kernels/ops.def; the CPU's version of the same
// math: kernels/moe_router.h.
#include "../moe_router.h"
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
#include "moe_router_kernels.cuh"  // the router kernels (also run on the CPU by a unit test)

template <typename T>
__global__ void dispatch_kernel(T* routed, const T* x, const int32_t* rows, int N, int K, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // over N*K*C
  if (i >= static_cast<size_t>(N) * K * C) return;
  const size_t slot = i / C, c = i % C;
  routed[static_cast<size_t>(rows[slot]) * C + c] = x[(slot / K) * C + c];
}

template <typename T>
__global__ void dispatch_backward_kernel(T* dx, const T* drouted, const int32_t* rows, int N, int K, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // over N*C
  if (i >= static_cast<size_t>(N) * C) return;
  const size_t t = i / C, c = i % C;
  float sum = 0;
  for (int j = 0; j < K; j++) sum += to_float(drouted[static_cast<size_t>(rows[t * K + j]) * C + c]);
  dx[i] = from_float<T>(sum);
}

template <typename T>
__global__ void combine_kernel(T* out, const T* expert_out, const float* weights, const int32_t* rows, int N, int K,
                               int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // over N*C
  if (i >= static_cast<size_t>(N) * C) return;
  const size_t t = i / C, c = i % C;
  float sum = 0;
  for (int j = 0; j < K; j++)
    sum += weights[t * K + j] * to_float(expert_out[static_cast<size_t>(rows[t * K + j]) * C + c]);
  out[i] = from_float<T>(sum);
}

// A block of 32 threads per (token, choice): the row's gradient and the dot product.
template <typename T>
__global__ void combine_backward_kernel(T* dexpert_out, float* dweights, const T* dout, const T* expert_out,
                                        const float* weights, const int32_t* rows, int N, int K, int C) {
  const size_t slot = blockIdx.x;  // over N*K
  const size_t t = slot / K, row = rows[slot];
  const float w = weights[slot];
  float dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_float(dout[t * C + c]);
    dot += d * to_float(expert_out[row * C + c]);
    dexpert_out[row * C + c] = from_float<T>(w * d);
  }
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
  if (threadIdx.x == 0) dweights[slot] = dot;
}

}  // namespace

template <typename T>
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits,
                        const float* bias, int N, int E, int K, bool renormalize, bool sigmoid) {
  if (N <= 0) return;
  router_forward_kernel<T><<<blocks_for(static_cast<size_t>(N) * 32, kThreads), kThreads, 0, compute_stream()>>>(
      probs, lse, experts, weights, logits, bias, N, E, K, renormalize, sigmoid);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_router_backward(T* dlogits, const float* probs, const float* lse, const int32_t* experts,
                         const float* weights, const float* dweights, const float* balance, int tokens_per_sequence,
                         float aux_scale, float z_scale, int N, int E, int K, bool renormalize, bool sigmoid) {
  if (N <= 0) return;
  router_backward_kernel<T><<<blocks_for(static_cast<size_t>(N) * 32, kThreads), kThreads, 0, compute_stream()>>>(
      dlogits, probs, lse, experts, weights, dweights, balance, tokens_per_sequence, aux_scale, z_scale, N, E, K,
      renormalize, sigmoid);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_dispatch(T* routed, const T* x, const int32_t* rows, int N, int K, int C) {
  const size_t n = static_cast<size_t>(N) * K * C;
  if (n == 0) return;
  dispatch_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(routed, x, rows, N, K, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_dispatch_backward(T* dx, const T* drouted, const int32_t* rows, int N, int K, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  if (n == 0) return;
  dispatch_backward_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(dx, drouted, rows, N, K, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_combine(T* out, const T* expert_out, const float* weights, const int32_t* rows, int N, int K, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  if (n == 0) return;
  combine_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(out, expert_out, weights, rows, N, K,
                                                                                 C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_combine_backward(T* dexpert_out, float* dweights, const T* dout, const T* expert_out, const float* weights,
                          const int32_t* rows, int N, int K, int C) {
  if (N <= 0 || K <= 0) return;
  combine_backward_kernel<T><<<static_cast<unsigned>(N) * K, 32, 0, compute_stream()>>>(
      dexpert_out, dweights, dout, expert_out, weights, rows, N, K, C);
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                                      \
  template void moe_router_forward<T>(float*, float*, int32_t*, float*, const T*, const float*, int, int, int, bool, \
                                       bool);                                                                      \
  template void moe_router_backward<T>(T*, const float*, const float*, const int32_t*, const float*, const float*, \
                                       const float*, int, float, float, int, int, int, bool, bool);                \
  template void moe_dispatch<T>(T*, const T*, const int32_t*, int, int, int);                                      \
  template void moe_dispatch_backward<T>(T*, const T*, const int32_t*, int, int, int);                             \
  template void moe_combine<T>(T*, const T*, const float*, const int32_t*, int, int, int);                         \
  template void moe_combine_backward<T>(T*, float*, const T*, const T*, const float*, const int32_t*, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)

}  // namespace trident::kernels::cuda
