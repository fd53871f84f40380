// Rotary position embeddings in Hugging Face's rotate-half convention, in place on the
// query and key heads of the fused qkv rows [q (NH heads) | k (NKV) | v (NKV)]: within a
// head, element i pairs with element i + HD/2 and the pair turns by angle t * freq_i.
#include "cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// direction +1: the rotation (forward); -1: its transpose (backward).
template <typename T>
void rotate(T* qkv, const T* table, int B, int T_, int NH, int NKV, int HD, T direction) {
  const int half = HD / 2, ld = (NH + 2 * NKV) * HD, heads = NH + NKV;
#pragma omp parallel for
  for (int bt = 0; bt < B * T_; bt++) {
    const T* cs = table + static_cast<size_t>(bt % T_) * HD;  // [HD/2][cos, sin]
    T* row = qkv + static_cast<size_t>(bt) * ld;
    for (int h = 0; h < heads; h++) {
      T* x = row + static_cast<size_t>(h) * HD;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const T c = cs[2 * i], s = direction * cs[2 * i + 1];
        const T x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(T* qkv, const T* table, int B, int T_, int NH, int NKV, int HD) {
  rotate(qkv, table, B, T_, NH, NKV, HD, T(1));
}

template <typename T>
void rope_backward(T* dqkv, const T* table, int B, int T_, int NH, int NKV, int HD) {
  rotate(dqkv, table, B, T_, NH, NKV, HD, T(-1));
}

template void rope_forward<float>(float*, const float*, int, int, int, int, int);
template void rope_forward<double>(double*, const double*, int, int, int, int, int);
template void rope_backward<float>(float*, const float*, int, int, int, int, int);
template void rope_backward<double>(double*, const double*, int, int, int, int, int);

}  // namespace trident::kernels::cpu
