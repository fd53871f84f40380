// One token's routing math (semantics: kernels/ops.def): the top-k of its scores and their
// weights, and the gradient of its logits, as the CPU router kernels (kernels/cpu/moe.cpp)
// run it, a token per thread. The CUDA kernels (kernels/cuda/moe.cu) run a token per warp
// with the same order and tie rule (outranks) and the same expressions per expert, but sum
// in another order. The softmax itself stays in each backend (the CPU sums in double, the
// GPU with its fast exp).
#pragma once

#include <cmath>
#include <cstdint>

#include "bf16.h"  // TRIDENT_HOST_DEVICE

namespace trident::kernels {

// The most experts a router has (model/layers/moe.cpp checks it): the CPU kernels keep a
// token's E values in arrays of this size on the thread's stack (a few KiB, nothing on a
// CPU). The CUDA kernels have no such arrays (a warp strides over the experts).
inline constexpr int kMaxRouterExperts = 512;

// The top-k's order: expert a (rank ra) before expert b (rank rb) when ranked higher, or
// equally and a < b (the first of the largest). An index below 0 is no expert (a warp
// lane with no candidate): after every expert. A NaN ranks as -inf (a step the trainer
// will skip): the order stays total, so every token still gets K distinct experts.
TRIDENT_HOST_DEVICE inline bool outranks(float ra, int a, float rb, int b) {
  if (ra != ra) ra = -INFINITY;
  if (rb != rb) rb = -INFINITY;
  return a >= 0 && (b < 0 || ra > rb || (ra == rb && a < b));
}

// The K largest of p[0..E) in order (the j-th: the first of the largest not yet taken),
// their probabilities as weights, divided by their sum when `renormalize`. `rank` (null:
// p) orders them instead, when p is a monotonic function of it that rounds distinct values
// together: the sigmoid router ranks by logit (its scores are all 1.0f above ~17).
TRIDENT_HOST_DEVICE inline void choose_top_k(const float* p, int E, int K, bool renormalize, int32_t* chosen,
                                             float* w, const float* rank = nullptr) {
  const float* r = rank != nullptr ? rank : p;
  float total = 0;
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || outranks(r[e], e, r[best], best))) best = e;
    }
    chosen[j] = best;
    w[j] = p[best];
    total += p[best];
  }
  if (renormalize)
    for (int j = 0; j < K; j++) w[j] /= total;
}

// The weights' part of d loss / d score, added to d[]: w_j = s[chosen j] / Z when
// `renormalize` (Z the chosen scores' sum): d/ds[chosen j] = (dw_j - sum_i dw_i w_i) / Z;
// else w_j = s[chosen j]: dw_j. A dropped pair (w = dw = 0) still counts in Z.
TRIDENT_HOST_DEVICE inline void add_weight_gradients(const float* s, const int32_t* chosen, const float* w,
                                                     const float* dw, int K, bool renormalize, float* d) {
  float z = 1, mean = 0;
  if (renormalize) {
    z = 0;
    for (int j = 0; j < K; j++) {
      z += s[chosen[j]];
      mean += dw[j] * w[j];
    }
  }
  for (int j = 0; j < K; j++) d[chosen[j]] += (dw[j] - mean) / z;
}

// d objective / d logits of one token, each passed to store(e, value): from the weights'
// gradients dw (through the renormalization), the balance loss's coefficients per expert
// (times aux_scale; null: none) and the z-loss (2 z_scale lse p), through the softmax.
template <typename Store>
TRIDENT_HOST_DEVICE inline void router_logit_gradient(const float* p, float lse, const int32_t* chosen, const float* w,
                                                      const float* dw, const float* balance, float aux_scale,
                                                      float z_scale, int E, int K, bool renormalize, Store store) {
  float dp[kMaxRouterExperts];  // d loss / d p[e]
  for (int e = 0; e < E; e++) dp[e] = balance != nullptr ? aux_scale * balance[e] : 0.0f;
  add_weight_gradients(p, chosen, w, dw, K, renormalize, dp);
  // Through the softmax: dl = p (dp - sum p dp); the z-loss's 2 lse p beside it.
  float dot = 0;
  for (int e = 0; e < E; e++) dot += p[e] * dp[e];
  for (int e = 0; e < E; e++) store(e, p[e] * (dp[e] - dot) + 2.0f * z_scale * lse * p[e]);
}

// The sigmoid router (DeepSeek-V3's scoring, Megatron's moe_router_score_function =
// sigmoid): each expert's score on its own, s = 1 / (1 + exp(-logit)). The router keeps the
// logits, and both passes compute the scores from them the same way.
TRIDENT_HOST_DEVICE inline float sigmoid_score(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// d objective / d logits of one token under sigmoid scores s (from its `logits`): the
// weights' gradients dw through the renormalization as above; the balance loss on the
// normalized scores s / sum(s) (its coefficients per expert times aux_scale; null: none),
// through the normalization; all through the sigmoid, s (1 - s). The z-loss (2 z_scale lse
// softmax) is on the logits as under softmax.
template <typename Store>
TRIDENT_HOST_DEVICE inline void sigmoid_router_logit_gradient(const float* logits, float lse, const int32_t* chosen,
                                                              const float* w, const float* dw, const float* balance,
                                                              float aux_scale, float z_scale, int E, int K,
                                                              bool renormalize, Store store) {
  float s[kMaxRouterExperts], ds[kMaxRouterExperts];  // the scores, d loss / d s
  float total = 0;
  for (int e = 0; e < E; e++) {
    s[e] = sigmoid_score(logits[e]);
    total += s[e];
  }
  // n = s / total: d/ds[f] = (b[f] - sum_e b[e] n[e]) / total.
  float dot = 0;
  if (balance != nullptr)
    for (int e = 0; e < E; e++) dot += balance[e] * s[e] / total;
  for (int e = 0; e < E; e++) ds[e] = balance != nullptr ? aux_scale * (balance[e] - dot) / total : 0.0f;
  add_weight_gradients(s, chosen, w, dw, K, renormalize, ds);
  // ds/dl = s (1 - s), with 1 - s as sigmoid(-l): it keeps its digits where s rounds to 1.
  for (int e = 0; e < E; e++)
    store(e, ds[e] * s[e] * sigmoid_score(-logits[e]) + 2.0f * z_scale * lse * expf(logits[e] - lse));
}

}  // namespace trident::kernels
