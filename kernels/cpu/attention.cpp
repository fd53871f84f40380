// Causal self-attention on CPU, with grouped-query attention: query head h reads
// key/value head h / (NH / NKV) (NKV == NH: plain multi-head). Per (batch, head), the
// queries are processed in chunks of kChunk rows; a chunk only multiplies against the
// keys it can see (0 .. its last row), so the GEMMs skip most of the masked upper
// triangle. q, k and v are read in place from the fused qkv rows [q | k | v] through
// leading dimensions, with no copies and no repeated key/value heads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

namespace {

constexpr int kChunk = 128;

// Column offsets of one batch row's q head h and of its key/value head in qkv.
struct HeadColumns {
  size_t q, k, v;
};

HeadColumns head_columns(int h, int NH, int NKV, int HD) {
  const int kv = h / (NH / NKV);
  return {static_cast<size_t>(h) * HD, static_cast<size_t>(NH + kv) * HD, static_cast<size_t>(NH + NKV + kv) * HD};
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, int B, int T_, int NH, int NKV, int HD) {
  const T scale = T(1) / std::sqrt(T(HD));
  const int ld = (NH + 2 * NKV) * HD, ldo = NH * HD;
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const HeadColumns col = head_columns(h, NH, NKV, HD);
    const T* row0 = qkv + static_cast<size_t>(b) * T_ * ld;
    const T *q = row0 + col.q, *k = row0 + col.k, *v = row0 + col.v;
    T* o = out + static_cast<size_t>(b) * T_ * ldo + col.q;
    T* p = probs + static_cast<size_t>(bh) * T_ * T_;
    for (int r0 = 0; r0 < T_; r0 += kChunk) {
      const int r1 = std::min(r0 + kChunk, T_), rows = r1 - r0;
      T* s = p + static_cast<size_t>(r0) * T_;
      gemm<T>(false, true, rows, r1, HD, scale, q + static_cast<size_t>(r0) * ld, ld, k, ld, T(0), s, T_);
      for (int i = 0; i < rows; i++) {
        T* row = s + static_cast<size_t>(i) * T_;
        const int visible = r0 + i + 1;
        // Vectorized (a max is exact in any order): the scalar loop cost as much as
        // both GEMMs of a chunk.
        T max = row[0];
#pragma omp simd reduction(max : max)
        for (int j = 1; j < visible; j++) max = row[j] > max ? row[j] : max;
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
      gemm<T>(false, false, rows, HD, r1, T(1), s, T_, v, ld, T(0), o + static_cast<size_t>(r0) * ldo, ldo);
    }
  }
}

size_t attention_backward_scratch_floats(int T_) { return static_cast<size_t>(kChunk) * T_; }

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int B, int T_, int NH, int NKV,
                        int HD) {
  const T scale = T(1) / std::sqrt(T(HD));
  const int ld = (NH + 2 * NKV) * HD, ldo = NH * HD, group = NH / NKV;
  // One task per (batch, key/value head): it owns dK and dV of that head and adds the
  // contributions of the group's query heads in order, so no two threads write the
  // same element and the sums run in a fixed order.
#pragma omp parallel for schedule(dynamic)
  for (int bkv = 0; bkv < B * NKV; bkv++) {
    static thread_local std::vector<T> dscores;  // one chunk of dP / dS, reused
    dscores.resize(static_cast<size_t>(kChunk) * T_);
    const int b = bkv / NKV, kv = bkv % NKV;
    const size_t batch = static_cast<size_t>(b) * T_ * ld;
    for (int g = 0; g < group; g++) {
      const int h = kv * group + g;
      const HeadColumns col = head_columns(h, NH, NKV, HD);
      const T *q = qkv + batch + col.q, *k = qkv + batch + col.k, *v = qkv + batch + col.v;
      T *dq = dqkv + batch + col.q, *dk = dqkv + batch + col.k, *dv = dqkv + batch + col.v;
      const T* dO = dout + static_cast<size_t>(b) * T_ * ldo + col.q;
      const T* p = probs + (static_cast<size_t>(b) * NH + h) * T_ * T_;
      // Last chunk first: it sees every key, so for the group's first head it
      // initializes dk and dv (beta = 0) and everything after adds onto them.
      const int last_r0 = ((T_ - 1) / kChunk) * kChunk;
      for (int r0 = last_r0; r0 >= 0; r0 -= kChunk) {
        const int r1 = std::min(r0 + kChunk, T_), rows = r1 - r0;
        const T beta = g == 0 && r0 == last_r0 ? T(0) : T(1);
        const T* pc = p + static_cast<size_t>(r0) * T_;
        const T* dOc = dO + static_cast<size_t>(r0) * ldo;
        T* ds = dscores.data();
        gemm<T>(false, true, rows, r1, HD, T(1), dOc, ldo, v, ld, T(0), ds, r1);  // dP = dO V^T
        gemm<T>(true, false, r1, HD, rows, T(1), pc, T_, dOc, ldo, beta, dv, ld);  // dV += P^T dO
        for (int i = 0; i < rows; i++) {                                         // dS = P (dP - <P,dP>)
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
        gemm<T>(false, false, rows, HD, r1, T(1), ds, r1, k, ld, T(0), dq + static_cast<size_t>(r0) * ld, ld);  // dQ = dS K
        gemm<T>(true, false, r1, HD, rows, T(1), ds, r1, q + static_cast<size_t>(r0) * ld, ld, beta, dk, ld);  // dK += dS^T Q
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, int);
template void attention_backward<float>(float*, const float*, const float*, const float*, int, int, int, int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, int, int, int, int,
                                         int);

}  // namespace trident::kernels::cpu
