// One token's routing math, shared by the CPU and CUDA router kernels (kernels/cpu/moe.cpp,
// kernels/cuda/moe.cu; semantics: kernels/ops.def): the top-k of its probabilities and
// their weights, and the gradient of its logits. The softmax itself stays in each backend
// (the CPU sums in double, the GPU with its fast exp).
#pragma once

#include <cstdint>

#include "bf16.h"  // TRIDENT_HOST_DEVICE

namespace trident::kernels {

// The most experts a router has: its kernels keep a token's E values in registers or on
// the stack (model/layers/moe.cpp checks it).
inline constexpr int kMaxRouterExperts = 512;

// The K largest of p[0..E) in order (the j-th: the first of the largest not yet taken),
// their probabilities as weights, divided by their sum when `renormalize`.
TRIDENT_HOST_DEVICE inline void choose_top_k(const float* p, int E, int K, bool renormalize, int32_t* chosen,
                                             float* w) {
  float total = 0;
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    chosen[j] = best;
    w[j] = p[best];
    total += p[best];
  }
  if (renormalize)
    for (int j = 0; j < K; j++) w[j] /= total;
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
  // w = p[chosen] / Z: d/dp[chosen j] = (dw_j - sum_i dw_i w_i) / Z, Z = sum of p[chosen].
  float z = 1, mean = 0;
  if (renormalize) {
    z = 0;
    for (int j = 0; j < K; j++) {
      z += p[chosen[j]];
      mean += dw[j] * w[j];
    }
  }
  for (int j = 0; j < K; j++) dp[chosen[j]] += (dw[j] - mean) / z;
  // Through the softmax: dl = p (dp - sum p dp); the z-loss's 2 lse p beside it.
  float dot = 0;
  for (int e = 0; e < E; e++) dot += p[e] * dp[e];
  for (int e = 0; e < E; e++) store(e, p[e] * (dp[e] - dot) + 2.0f * z_scale * lse * p[e]);
}

}  // namespace trident::kernels
