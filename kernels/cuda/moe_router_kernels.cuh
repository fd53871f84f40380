// The MoE router's kernels, a warp per token (kernels/cuda/moe.cu launches them; ops.def:
// moe_router_forward / moe_router_backward). Kept in a header of their own, without
// includes, so that tests/unit/test_moe_router_warp.cpp runs them on CPU threads
// (tests/unit/cuda_simulator.h) against the CPU kernels: the includer has
// kernels/moe_router.h and the element type's to_float / from_float.
// No per-thread array sized by E: a stack frame here would be local memory the driver
// reserves for every resident thread (tests/cuda/test_router_stack.sh checks ptxas).

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
                                      const float* bias, int N, int E, int K, bool renormalize, bool sigmoid) {
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
  __syncwarp();  // lane 0 reads the chosen experts' p below, which other lanes wrote
  // An expert's score from p[e]: its probability, or the sigmoid of its logit.
  const auto score = [&](float v) { return sigmoid ? sigmoid_score(v) : v; };

  // choose_top_k's order, one choice per round: each lane's best of its experts ranked
  // below the last choice (those above are taken), then the warp's best of those. The rank
  // is p[e] (the lane wrote it above), or with an expert bias the score plus its bias; the
  // weight is the score.
  int32_t* chosen = experts + static_cast<size_t>(t) * K;
  float* w = weights + static_cast<size_t>(t) * K;
  float last_rank = 0, total = 0;
  int last = -1;
  for (int j = 0; j < K; j++) {
    float best_rank = 0;
    int best = -1;
    for (int e = lane; e < E; e += 32) {
      const float r = bias != nullptr ? score(p[e]) + bias[e] : p[e];
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
      w[j] = score(bias != nullptr ? p[best] : best_rank);
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
