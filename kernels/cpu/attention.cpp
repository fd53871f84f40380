// Causal self-attention on CPU. Per (batch, head), the queries are processed in chunks
// of kChunk rows; a chunk only multiplies against the keys it can see (0 .. its last
// row), so the GEMMs skip most of the masked upper triangle. q, k and v are read in
// place from the fused qkv tensor through leading dimensions (3C), with no copies.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

namespace {

constexpr int kChunk = 128;

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, int B, int T_, int C, int NH) {
  const int hd = C / NH;
  const T scale = T(1) / std::sqrt(T(hd));
  const int ld = 3 * C;
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const T* q = qkv + static_cast<size_t>(b) * T_ * ld + h * hd;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* o = out + static_cast<size_t>(b) * T_ * C + h * hd;
    T* p = probs + static_cast<size_t>(bh) * T_ * T_;
    for (int r0 = 0; r0 < T_; r0 += kChunk) {
      const int r1 = std::min(r0 + kChunk, T_), rows = r1 - r0;
      T* s = p + static_cast<size_t>(r0) * T_;
      gemm<T>(false, true, rows, r1, hd, scale, q + static_cast<size_t>(r0) * ld, ld, k, ld, T(0), s, T_);
      for (int i = 0; i < rows; i++) {
        T* row = s + static_cast<size_t>(i) * T_;
        const int visible = r0 + i + 1;
        T max = row[0];
        for (int j = 1; j < visible; j++) max = std::max(max, row[j]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < visible; j++) {
          row[j] = fast_exp(row[j] - max);
          sum += row[j];
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int j = 0; j < visible; j++) row[j] *= inv;
        for (int j = visible; j < r1; j++) row[j] = 0;
      }
      gemm<T>(false, false, rows, hd, r1, T(1), s, T_, v, ld, T(0), o + static_cast<size_t>(r0) * C, C);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int B, int T_, int C,
                        int NH) {
  const int hd = C / NH;
  const T scale = T(1) / std::sqrt(T(hd));
  const int ld = 3 * C;
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < B * NH; bh++) {
    static thread_local std::vector<T> dscores;  // one chunk of dP / dS, reused
    dscores.resize(static_cast<size_t>(kChunk) * T_);
    const int b = bh / NH, h = bh % NH;
    const size_t head = static_cast<size_t>(b) * T_ * ld + h * hd;
    const T *q = qkv + head, *k = q + C, *v = q + 2 * C;
    T *dq = dqkv + head, *dk = dq + C, *dv = dq + 2 * C;
    const T* dO = dout + static_cast<size_t>(b) * T_ * C + h * hd;
    const T* p = probs + static_cast<size_t>(bh) * T_ * T_;
    // Last chunk first: it sees every key, so it initializes dk and dv (beta = 0)
    // and the earlier chunks add onto them.
    const int last_r0 = ((T_ - 1) / kChunk) * kChunk;
    for (int r0 = last_r0; r0 >= 0; r0 -= kChunk) {
      const int r1 = std::min(r0 + kChunk, T_), rows = r1 - r0;
      const T beta = r0 == last_r0 ? T(0) : T(1);
      const T* pc = p + static_cast<size_t>(r0) * T_;
      const T* dOc = dO + static_cast<size_t>(r0) * C;
      T* ds = dscores.data();
      gemm<T>(false, true, rows, r1, hd, T(1), dOc, C, v, ld, T(0), ds, r1);      // dP = dO V^T
      gemm<T>(true, false, r1, hd, rows, T(1), pc, T_, dOc, C, beta, dv, ld);     // dV += P^T dO
      for (int i = 0; i < rows; i++) {                                           // dS = P (dP - <P,dP>)
        const T* prow = pc + static_cast<size_t>(i) * T_;
        T* drow = ds + static_cast<size_t>(i) * r1;
        const int visible = r0 + i + 1;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < visible; j++) dot += prow[j] * drow[j];
#pragma omp simd
        for (int j = 0; j < visible; j++) drow[j] = prow[j] * (drow[j] - dot) * scale;
        for (int j = visible; j < r1; j++) drow[j] = 0;
      }
      gemm<T>(false, false, rows, hd, r1, T(1), ds, r1, k, ld, T(0), dq + static_cast<size_t>(r0) * ld, ld);  // dQ = dS K
      gemm<T>(true, false, r1, hd, rows, T(1), ds, r1, q + static_cast<size_t>(r0) * ld, ld, beta, dk, ld);  // dK += dS^T Q
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int);
template void attention_backward<float>(float*, const float*, const float*, const float*, int, int, int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, int, int, int, int);

}  // namespace trident::kernels::cpu
