// Mixture of experts: the router's softmax and top-k, and the tokens' dispatch to their
// experts' rows and the weighted combination back (semantics: kernels/ops.def).
#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits, int N, int E,
                        int K, bool renormalize) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    const T* l = logits + static_cast<size_t>(t) * E;
    float* p = probs + static_cast<size_t>(t) * E;
    float max = -INFINITY;
    for (int e = 0; e < E; e++) max = std::max(max, static_cast<float>(l[e]));
    double sum = 0;
    for (int e = 0; e < E; e++) sum += std::exp(static_cast<double>(l[e]) - max);
    for (int e = 0; e < E; e++) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - max) / sum);
    lse[t] = max + static_cast<float>(std::log(sum));
    int32_t* chosen = experts + static_cast<size_t>(t) * K;
    float* w = weights + static_cast<size_t>(t) * K;
    float total = 0;
    for (int j = 0; j < K; j++) {  // the j-th largest: the first of the largest not yet taken
      int best = -1;
      for (int e = 0; e < E; e++) {
        if (std::find(chosen, chosen + j, e) != chosen + j) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      chosen[j] = best;
      w[j] = p[best];
      total += p[best];
    }
    if (renormalize)
      for (int j = 0; j < K; j++) w[j] /= total;
  }
}

template <typename T>
void moe_router_backward(T* dlogits, const float* probs, const float* lse, const int32_t* experts,
                         const float* weights, const float* dweights, const float* balance, int tokens_per_sequence,
                         float aux_scale, float z_scale, int N, int E, int K, bool renormalize) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    const float* p = probs + static_cast<size_t>(t) * E;
    const int32_t* chosen = experts + static_cast<size_t>(t) * K;
    const float *w = weights + static_cast<size_t>(t) * K, *dw = dweights + static_cast<size_t>(t) * K;
    // d loss / d p[e], then through the softmax: dl = p (dp - sum p dp).
    float dp[512];  // E <= 512 (checked by the layer)
    for (int e = 0; e < E; e++)
      dp[e] = balance != nullptr ? aux_scale * balance[static_cast<size_t>(t / tokens_per_sequence) * E + e] : 0.0f;
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
    float dot = 0;
    for (int e = 0; e < E; e++) dot += p[e] * dp[e];
    T* dl = dlogits + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; e++) dl[e] = static_cast<T>(p[e] * (dp[e] - dot) + 2.0f * z_scale * lse[t] * p[e]);
  }
}

template <typename T>
void moe_dispatch(T* routed, const T* x, const int32_t* rows, int N, int K, int C) {
#pragma omp parallel for
  for (int i = 0; i < N * K; i++)
    std::copy_n(x + static_cast<size_t>(i / K) * C, C, routed + static_cast<size_t>(rows[i]) * C);
}

template <typename T>
void moe_dispatch_backward(T* dx, const T* drouted, const int32_t* rows, int N, int K, int C) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    T* d = dx + static_cast<size_t>(t) * C;
    std::copy_n(drouted + static_cast<size_t>(rows[static_cast<size_t>(t) * K]) * C, C, d);
    for (int j = 1; j < K; j++) {
      const T* src = drouted + static_cast<size_t>(rows[static_cast<size_t>(t) * K + j]) * C;
      for (int c = 0; c < C; c++) d[c] += src[c];
    }
  }
}

template <typename T>
void moe_combine(T* out, const T* expert_out, const float* weights, const int32_t* rows, int N, int K, int C) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    T* o = out + static_cast<size_t>(t) * C;
    std::fill_n(o, C, T(0));
    for (int j = 0; j < K; j++) {
      const size_t i = static_cast<size_t>(t) * K + j;
      const T* y = expert_out + static_cast<size_t>(rows[i]) * C;
      const T w = static_cast<T>(weights[i]);
      for (int c = 0; c < C; c++) o[c] += w * y[c];
    }
  }
}

template <typename T>
void moe_combine_backward(T* dexpert_out, float* dweights, const T* dout, const T* expert_out, const float* weights,
                          const int32_t* rows, int N, int K, int C) {
#pragma omp parallel for
  for (int i = 0; i < N * K; i++) {
    const T* d = dout + static_cast<size_t>(i / K) * C;
    const T* y = expert_out + static_cast<size_t>(rows[i]) * C;
    T* dy = dexpert_out + static_cast<size_t>(rows[i]) * C;
    const T w = static_cast<T>(weights[i]);
    double dot = 0;
    for (int c = 0; c < C; c++) {
      dot += static_cast<double>(d[c]) * y[c];
      dy[c] = w * d[c];
    }
    dweights[i] = static_cast<float>(dot);
  }
}

template void moe_router_forward<float>(float*, float*, int32_t*, float*, const float*, int, int, int, bool);
template void moe_router_backward<float>(float*, const float*, const float*, const int32_t*, const float*,
                                         const float*, const float*, int, float, float, int, int, int, bool);
template void moe_dispatch<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_dispatch_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_combine<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void moe_combine_backward<float>(float*, float*, const float*, const float*, const float*, const int32_t*,
                                          int, int, int);

}  // namespace trident::kernels::cpu
