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
constexpr unsigned kFullWarp = 0xffffffffu;

// Every lane gets the warp's max / sum.
__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, offset));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// The router kernels run a warp per token: token (global thread / 32), lane (thread % 32)
// owns experts lane, lane + 32, ... (consecutive lanes read consecutive values of the row).
__device__ inline int router_token() { return static_cast<int>((blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32); }

template <typename T>
__global__ void router_forward_kernel(float* probs, float* lse, int32_t* experts, float* weights, const T* logits,
                                      int N, int E, int K, bool renormalize, bool sigmoid) {
  const int t = router_token(), lane = threadIdx.x % 32;
  if (t >= N) return;  // the whole warp: t is the same in every lane
  const T* l = logits + static_cast<size_t>(t) * E;
  float* p = probs + static_cast<size_t>(t) * E;
  float max = -INFINITY;
  for (int e = lane; e < E; e += 32) max = fmaxf(max, to_float(l[e]));
  max = warp_max(max);
  float sum = 0;
  for (int e = lane; e < E; e += 32) sum += __expf(to_float(l[e]) - max);
  sum = warp_sum(sum);
  if (lane == 0) lse[t] = max + logf(sum);
  // The probabilities, or under sigmoid the logits (the backward computes the scores again).
  for (int e = lane; e < E; e += 32) p[e] = sigmoid ? to_float(l[e]) : __expf(to_float(l[e]) - max) / sum;

  // choose_top_k's order, one choice per round: each lane's best of its experts ranked
  // below the last choice (those above are taken), then the warp's best of those. p[e] is
  // the rank (the lane wrote it above); the weight is p, or the sigmoid's score.
  int32_t* chosen = experts + static_cast<size_t>(t) * K;
  float* w = weights + static_cast<size_t>(t) * K;
  float last_rank = 0, total = 0;
  int last = -1;
  for (int j = 0; j < K; j++) {
    float best_rank = 0;
    int best = -1;
    for (int e = lane; e < E; e += 32) {
      const float r = p[e];
      if ((last < 0 || outranks(last_rank, last, r, e)) && outranks(r, e, best_rank, best)) {
        best_rank = r;
        best = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {  // a total order: every lane ends with the same best
      const float other_rank = __shfl_xor_sync(kFullWarp, best_rank, offset);
      const int other = __shfl_xor_sync(kFullWarp, best, offset);
      if (outranks(other_rank, other, best_rank, best)) {
        best_rank = other_rank;
        best = other;
      }
    }
    last_rank = best_rank;
    last = best;
    if (lane == 0) {  // the weights summed in choose_top_k's order
      chosen[j] = best;
      w[j] = sigmoid ? sigmoid_score(best_rank) : best_rank;
      total += w[j];
    }
  }
  if (renormalize && lane == 0)
    for (int j = 0; j < K; j++) w[j] /= total;
}

// router_logit_gradient / sigmoid_router_logit_gradient (moe_router.h) with the token's
// d loss / d score per expert computed again where needed instead of kept in an array.
template <typename T>
__global__ void router_backward_kernel(T* dlogits, const float* probs, const float* lse, const int32_t* experts,
                                       const float* weights, const float* dweights, const float* balance,
                                       int tokens_per_sequence, float aux_scale, float z_scale, int N, int E, int K,
                                       bool renormalize, bool sigmoid) {
  const int t = router_token(), lane = threadIdx.x % 32;
  if (t >= N) return;  // the whole warp
  const size_t k = static_cast<size_t>(t) * K;
  const int32_t* chosen = experts + k;
  const float *w = weights + k, *dw = dweights + k;
  const float* p = probs + static_cast<size_t>(t) * E;  // the probabilities, or the logits under sigmoid
  const float* b = balance != nullptr ? balance + static_cast<size_t>(t / tokens_per_sequence) * E : nullptr;
  T* dl = dlogits + static_cast<size_t>(t) * E;
  const float token_lse = lse[t];
  const auto score = [=](int e) { return sigmoid ? sigmoid_score(p[e]) : p[e]; };

  // add_weight_gradients' Z and mean, the same in every lane (K is small).
  float z = 1, mean = 0;
  if (renormalize) {
    z = 0;
    for (int j = 0; j < K; j++) {
      z += score(chosen[j]);
      mean += dw[j] * w[j];
    }
  }
  // Under sigmoid the balance loss is on s / total: its dot product with the coefficients.
  float total = 1, balance_dot = 0;
  if (sigmoid) {
    float sum = 0;
    for (int e = lane; e < E; e += 32) sum += score(e);
    total = warp_sum(sum);
    if (b != nullptr) {
      float dot = 0;
      for (int e = lane; e < E; e += 32) dot += b[e] * score(e) / total;
      balance_dot = warp_sum(dot);
    }
  }
  // d loss / d score of expert e: the balance loss's part, then the chosen pair's.
  const auto dscore = [=](int e) {
    float d = b == nullptr ? 0.0f : sigmoid ? aux_scale * (b[e] - balance_dot) / total : aux_scale * b[e];
    for (int j = 0; j < K; j++)
      if (chosen[j] == e) d += (dw[j] - mean) / z;
    return d;
  };
  if (sigmoid) {  // ds/dl = s (1 - s), 1 - s as sigmoid(-l); the z-loss through the softmax
    for (int e = lane; e < E; e += 32)
      dl[e] = from_float<T>(dscore(e) * score(e) * sigmoid_score(-p[e]) +
                            2.0f * z_scale * token_lse * expf(p[e] - token_lse));
    return;
  }
  // Through the softmax: dl = p (dp - sum p dp), the z-loss's 2 lse p beside it.
  float dot = 0;
  for (int e = lane; e < E; e += 32) dot += p[e] * dscore(e);
  dot = warp_sum(dot);
  for (int e = lane; e < E; e += 32)
    dl[e] = from_float<T>(p[e] * (dscore(e) - dot) + 2.0f * z_scale * token_lse * p[e]);
}

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
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits, int N, int E,
                        int K, bool renormalize, bool sigmoid) {
  if (N <= 0) return;
  router_forward_kernel<T><<<blocks_for(static_cast<size_t>(N) * 32, kThreads), kThreads, 0, compute_stream()>>>(
      probs, lse, experts, weights, logits, N, E, K, renormalize, sigmoid);
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
  template void moe_router_forward<T>(float*, float*, int32_t*, float*, const T*, int, int, int, bool, bool);      \
  template void moe_router_backward<T>(T*, const float*, const float*, const int32_t*, const float*, const float*, \
                                       const float*, int, float, float, int, int, int, bool, bool);                \
  template void moe_dispatch<T>(T*, const T*, const int32_t*, int, int, int);                                      \
  template void moe_dispatch_backward<T>(T*, const T*, const int32_t*, int, int, int);                             \
  template void moe_combine<T>(T*, const T*, const float*, const int32_t*, int, int, int);                         \
  template void moe_combine_backward<T>(T*, float*, const T*, const T*, const float*, const int32_t*, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)

}  // namespace trident::kernels::cuda
