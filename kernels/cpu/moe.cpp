// Mixture of experts: the router's softmax (or sigmoid) and top-k, and the tokens' dispatch to their
// experts' rows and the weighted combination back (semantics: kernels/ops.def).
#include <algorithm>
#include <cmath>

#include "../moe_router.h"
#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits, int N, int E,
                        int K, bool renormalize, bool sigmoid) {
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
    choose_top_k(scores, E, K, renormalize, experts + static_cast<size_t>(t) * K, weights + static_cast<size_t>(t) * K,
                 sigmoid ? p : nullptr);
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

template void moe_router_forward<float>(float*, float*, int32_t*, float*, const float*, int, int, int, bool, bool);
template void moe_router_backward<float>(float*, const float*, const float*, const int32_t*, const float*,
                                         const float*, const float*, int, float, float, int, int, int, bool, bool);
template void moe_dispatch<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_dispatch_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void moe_combine<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void moe_combine_backward<float>(float*, float*, const float*, const float*, const float*, const int32_t*,
                                          int, int, int);

}  // namespace trident::kernels::cpu
