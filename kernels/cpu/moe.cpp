// Mixture of experts: the router's softmax (or sigmoid) and top-k, and the tokens' dispatch to their
// experts' rows and the weighted combination back (semantics: kernels/ops.def).
#include <algorithm>
#include <cmath>
#include <vector>

#include "../moe_router.h"
#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits,
                        const float* bias, int N, int E, int K, bool renormalize, bool sigmoid) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    const T* l = logits + static_cast<size_t>(t) * E;
    float* p = probs + static_cast<size_t>(t) * E;
    float max = -INFINITY;
    for (int e = 0; e < E; e++) max = std::max(max, static_cast<float>(l[e]));
    double sum = 0;
    for (int e = 0; e < E; e++) sum += std::exp(static_cast<double>(l[e]) - max);
    lse[t] = max + static_cast<float>(std::log(sum));
    float scores[kMaxRouterExperts];
    for (int e = 0; e < E; e++) {
      if (sigmoid) {
        p[e] = static_cast<float>(l[e]);  // kept: the backward's scores come from the logits
        scores[e] = sigmoid_score(p[e]);
      } else {
        p[e] = scores[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - max) / sum);
      }
    }
    // The choice's order: the scores (the sigmoid's by logit: see choose_top_k), or with an
    // expert bias the scores plus it.
    float biased[kMaxRouterExperts];
    if (bias != nullptr)
      for (int e = 0; e < E; e++) biased[e] = scores[e] + bias[e];
    choose_top_k(scores, E, K, renormalize, experts + static_cast<size_t>(t) * K, weights + static_cast<size_t>(t) * K,
                 bias != nullptr ? biased : sigmoid ? p : nullptr);
  }
}

template <typename T>
void moe_router_backward(T* dlogits, const float* probs, const float* lse, const int32_t* experts,
                         const float* weights, const float* dweights, const float* balance, int tokens_per_sequence,
                         float aux_scale, float z_scale, int N, int E, int K, bool renormalize, bool sigmoid) {
#pragma omp parallel for
  for (int t = 0; t < N; t++) {
    const size_t k = static_cast<size_t>(t) * K;
    T* dl = dlogits + static_cast<size_t>(t) * E;
    const float* b = balance != nullptr ? balance + static_cast<size_t>(t / tokens_per_sequence) * E : nullptr;
    const auto store = [dl](int e, float v) { dl[e] = static_cast<T>(v); };
    if (sigmoid)
      sigmoid_router_logit_gradient(probs + static_cast<size_t>(t) * E, lse[t], experts + k, weights + k, dweights + k,
                                    b, aux_scale, z_scale, E, K, renormalize, store);
    else
      router_logit_gradient(probs + static_cast<size_t>(t) * E, lse[t], experts + k, weights + k, dweights + k, b,
                            aux_scale, z_scale, E, K, renormalize, store);
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

void moe_permute(int32_t* rows, float* counts, const int32_t* experts, int NK, int E) {
  std::vector<int32_t> next(E + 1, 0);
  for (int i = 0; i < NK; i++) next[experts[i] + 1]++;
  for (int e = 0; e < E; e++) counts[e] = static_cast<float>(next[e + 1]);
  for (int e = 1; e <= E; e++) next[e] += next[e - 1];  // next[e]: expert e's first row
  for (int i = 0; i < NK; i++) rows[i] = next[experts[i]]++;
}

void moe_balance_statistics(float* stats, float* token_totals, const int32_t* experts, const float* probs, int N,
                            int T, int E, int K, bool sigmoid) {
  std::fill_n(stats, static_cast<size_t>(N / T) * 2 * E, 0.0f);
  for (int t = 0; t < N; t++) {  // in token order: every sum the same on every run
    float* s = stats + static_cast<size_t>(t / T) * 2 * E;
    for (int j = 0; j < K; j++) s[experts[static_cast<size_t>(t) * K + j]] += 1;
    const float* p = probs + static_cast<size_t>(t) * E;
    if (!sigmoid) {
      for (int e = 0; e < E; e++) s[E + e] += p[e];
      continue;
    }
    float& total = token_totals[t];
    total = 0;
    for (int e = 0; e < E; e++) total += sigmoid_score(p[e]);
    for (int e = 0; e < E; e++) s[E + e] += sigmoid_score(p[e]) / total;
  }
}

void moe_balance_loss(float* coefficients, double* loss_sum, const float* stats, const float* lse, int sequences,
                      int N, int E, int K, int seq_len, double aux_coef, double z_coef, bool with_aux) {
  const double T = seq_len;
  double aux = 0, z = 0;
  for (int b = 0; b < sequences; b++) {
    const float* s = stats + static_cast<size_t>(b) * 2 * E;
    for (int e = 0; e < E; e++) {
      aux += aux_coef * E / (K * T * T) * s[e] * s[E + e];
      coefficients[static_cast<size_t>(b) * E + e] = static_cast<float>(aux_coef * E / (K * T) * s[e]);
    }
  }
  if (loss_sum == nullptr) return;
  for (int t = 0; t < N; t++) z += static_cast<double>(lse[t]) * lse[t];
  *loss_sum += (with_aux ? aux : 0.0) + z_coef * z / T;
}

template void moe_router_forward<float>(float*, float*, int32_t*, float*, const float*, const float*, int, int, int, bool,
                                         bool);
template void moe_router_backward<float>(float*, const float*, const float*, const int32_t*, const float*,
                                         const float*, const float*, int, float, float, int, int, int, bool, bool);
template void moe_dispatch<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_dispatch_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_combine<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void moe_combine_backward<float>(float*, float*, const float*, const float*, const float*, const int32_t*,
                                          int, int, int);

}  // namespace trident::kernels::cpu
