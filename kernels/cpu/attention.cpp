// Masked self-attention on CPU, flash-attention style, with grouped-query attention:
// query head h reads key/value head h / (NH / NKV) (NKV == NH: plain multi-head). Per
// (batch, head), the queries are processed in chunks of kChunk rows; a chunk multiplies
// only against the keys some of its rows can see (kernels/attention_mask.h: a row sees a
// contiguous range of keys, from its document's start to its own position, since both
// position lists increase), so the GEMMs skip the masked future and, with documents
// packed into a sequence, every earlier document. Forward keeps each row's log-sum-exp,
// never the probabilities; backward recomputes them chunk by chunk. q is read in place
// from the fused qkv rows, k and v from their own rows (the same rows, or a block of keys
// from another rank) through leading dimensions, with no copies.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

namespace {

constexpr int kChunk = 128;

// The keys [begin, end) that one query row sees.
struct KeyRange {
  int begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

// Each row of the chunk [r0, r1) of sequence b: its visible keys, and the chunk's hull.
struct ChunkKeys {
  KeyRange rows[kChunk];
  KeyRange hull;
};

void visible_keys(ChunkKeys& keys, const AttentionMask& m, int b, int Tq, int Tk, int r0, int r1) {
  const int32_t* kv_end = m.kv_pos + Tk;
  keys.hull = {Tk, 0};
  for (int i = r0; i < r1; i++) {
    const int32_t first = m.doc_start != nullptr ? m.doc_start[static_cast<size_t>(b) * Tq + i]
                                                 : std::numeric_limits<int32_t>::min();
    KeyRange& r = keys.rows[i - r0];
    r.begin = static_cast<int>(std::lower_bound(m.kv_pos, kv_end, first) - m.kv_pos);
    r.end = static_cast<int>(std::upper_bound(m.kv_pos, kv_end, m.q_pos[i]) - m.kv_pos);
    if (r.empty()) continue;
    keys.hull.begin = std::min(keys.hull.begin, r.begin);
    keys.hull.end = std::max(keys.hull.end, r.end);
  }
}

// Column offsets of query head h in a qkv row, and of its key/value head in a kv row.
struct HeadColumns {
  size_t q, k, v;
};

HeadColumns head_columns(int h, int NH, int NKV, int HD) {
  const int g = h / (NH / NKV);
  return {static_cast<size_t>(h) * HD, static_cast<size_t>(g) * HD, static_cast<size_t>(NKV + g) * HD};
}

// Positions 0 .. T-1 (plain causal attention).
const int32_t* positions(int T_) {
  static thread_local std::vector<int32_t> iota;
  if (static_cast<int>(iota.size()) < T_) {
    iota.resize(T_);
    std::iota(iota.begin(), iota.end(), 0);
  }
  return iota.data();
}

}  // namespace

size_t attention_scratch_floats(int Tk) { return 2 * static_cast<size_t>(kChunk) * Tk; }

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, const T* kv, int kv_ld, const AttentionMask& mask, int B,
                       int Tq, int Tk, int NH, int NKV, int HD) {
  const T scale = T(1) / std::sqrt(T(HD));
  const int ld = (NH + 2 * NKV) * HD, ldo = NH * HD;
#pragma omp parallel for schedule(dynamic)
  for (int bh = 0; bh < B * NH; bh++) {
    static thread_local std::vector<T> scores;  // one chunk of rows x visible keys, reused
    static thread_local ChunkKeys keys;
    const int b = bh / NH, h = bh % NH;
    const HeadColumns col = head_columns(h, NH, NKV, HD);
    const T* q = qkv + static_cast<size_t>(b) * Tq * ld + col.q;
    const T* kv_rows = kv + static_cast<size_t>(b) * Tk * kv_ld;
    T* o = out + static_cast<size_t>(b) * Tq * ldo + col.q;
    T* row_lse = lse + static_cast<size_t>(bh) * Tq;
    for (int r0 = 0; r0 < Tq; r0 += kChunk) {
      const int r1 = std::min(r0 + kChunk, Tq), rows = r1 - r0;
      visible_keys(keys, mask, b, Tq, Tk, r0, r1);
      const KeyRange hull = keys.hull;
      if (hull.empty()) {  // no row of the chunk sees a key of this block
        for (int i = r0; i < r1; i++) {
          std::fill_n(o + static_cast<size_t>(i) * ldo, HD, T(0));
          row_lse[i] = -std::numeric_limits<T>::infinity();
        }
        continue;
      }
      const int n = hull.end - hull.begin;
      scores.resize(static_cast<size_t>(rows) * n);
      T* s = scores.data();
      const T* k = kv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.k;
      const T* v = kv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.v;
      gemm<T>(false, true, rows, n, HD, scale, q + static_cast<size_t>(r0) * ld, ld, k, kv_ld, T(0), s, n);
      for (int i = 0; i < rows; i++) {
        T* row = s + static_cast<size_t>(i) * n;
        const int j0 = keys.rows[i].begin - hull.begin, j1 = keys.rows[i].end - hull.begin;
        if (j1 <= j0) {
          std::fill_n(row, n, T(0));
          row_lse[r0 + i] = -std::numeric_limits<T>::infinity();
          continue;
        }
        // Vectorized (a max is exact in any order): the scalar loop cost as much as
        // both GEMMs of a chunk.
        T max = row[j0];
#pragma omp simd reduction(max : max)
        for (int j = j0 + 1; j < j1; j++) max = row[j] > max ? row[j] : max;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = j0; j < j1; j++) {
          row[j] = fast_exp(row[j] - max);
          sum += row[j];
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int j = j0; j < j1; j++) row[j] *= inv;
        std::fill(row, row + j0, T(0));
        std::fill(row + j1, row + n, T(0));
        row_lse[r0 + i] = max + std::log(sum);
      }
      gemm<T>(false, false, rows, HD, n, T(1), s, n, v, kv_ld, T(0), o + static_cast<size_t>(r0) * ldo, ldo);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, int kv_ld, const T* out,
                        const T* lse, const AttentionMask& mask, int B, int Tq, int Tk, int NH, int NKV, int HD) {
  const T scale = T(1) / std::sqrt(T(HD));
  const int ld = (NH + 2 * NKV) * HD, ldo = NH * HD, group = NH / NKV;
  // One task per (batch, key/value head): it owns dK and dV of that head and adds the
  // contributions of the group's query heads in order, so no two threads write the
  // same element and the sums run in a fixed order.
#pragma omp parallel for schedule(dynamic)
  for (int bkv = 0; bkv < B * NKV; bkv++) {
    static thread_local std::vector<T> scratch;  // one chunk of P and of dP / dS, reused
    static thread_local ChunkKeys keys;
    const int b = bkv / NKV, g0 = bkv % NKV;
    const T* kv_rows = kv + static_cast<size_t>(b) * Tk * kv_ld;
    T* dkv_rows = dkv + static_cast<size_t>(b) * Tk * kv_ld;
    const HeadColumns first = head_columns(g0 * group, NH, NKV, HD);
    for (int j = 0; j < Tk; j++) {
      std::fill_n(dkv_rows + static_cast<size_t>(j) * kv_ld + first.k, HD, T(0));
      std::fill_n(dkv_rows + static_cast<size_t>(j) * kv_ld + first.v, HD, T(0));
    }
    for (int h = g0 * group; h < (g0 + 1) * group; h++) {
      const HeadColumns col = head_columns(h, NH, NKV, HD);
      const T* q = qkv + static_cast<size_t>(b) * Tq * ld + col.q;
      T* dq = dqkv + static_cast<size_t>(b) * Tq * ld + col.q;
      const T* dO = dout + static_cast<size_t>(b) * Tq * ldo + col.q;
      const T* O = out + static_cast<size_t>(b) * Tq * ldo + col.q;
      const T* row_lse = lse + (static_cast<size_t>(b) * NH + h) * Tq;
      for (int r0 = 0; r0 < Tq; r0 += kChunk) {
        const int r1 = std::min(r0 + kChunk, Tq), rows = r1 - r0;
        visible_keys(keys, mask, b, Tq, Tk, r0, r1);
        const KeyRange hull = keys.hull;
        if (hull.empty()) {
          for (int i = r0; i < r1; i++) std::fill_n(dq + static_cast<size_t>(i) * ld, HD, T(0));
          continue;
        }
        const int n = hull.end - hull.begin;
        scratch.resize(2 * static_cast<size_t>(rows) * n);
        T *p = scratch.data(), *ds = p + static_cast<size_t>(rows) * n;
        const T* k = kv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.k;
        const T* v = kv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.v;
        T* dk = dkv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.k;
        T* dv = dkv_rows + static_cast<size_t>(hull.begin) * kv_ld + col.v;
        const T* qc = q + static_cast<size_t>(r0) * ld;
        const T* dOc = dO + static_cast<size_t>(r0) * ldo;
        gemm<T>(false, true, rows, n, HD, scale, qc, ld, k, kv_ld, T(0), p, n);     // S = q k^T / sqrt(HD)
        gemm<T>(false, true, rows, n, HD, T(1), dOc, ldo, v, kv_ld, T(0), ds, n);  // dP = dO V^T
        for (int i = 0; i < rows; i++) {  // P = exp(S - lse); dS = P (dP - <dO, O>) / sqrt(HD)
          T* prow = p + static_cast<size_t>(i) * n;
          T* drow = ds + static_cast<size_t>(i) * n;
          const int j0 = keys.rows[i].begin - hull.begin, j1 = keys.rows[i].end - hull.begin;
          if (j1 <= j0) {
            std::fill(prow, prow + n, T(0));
            std::fill(drow, drow + n, T(0));
            continue;
          }
          std::fill(prow, prow + j0, T(0));
          std::fill(drow, drow + j0, T(0));
          // The whole row's <dO, O> (= sum of P dP over every key it sees, in any block).
          const T* dOi = dOc + static_cast<size_t>(i) * ldo;
          const T* Oi = O + static_cast<size_t>(r0 + i) * ldo;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int d = 0; d < HD; d++) dot += dOi[d] * Oi[d];
          const T row_max = row_lse[r0 + i];
#pragma omp simd
          for (int j = j0; j < j1; j++) {
            prow[j] = fast_exp(prow[j] - row_max);
            drow[j] = prow[j] * (drow[j] - dot) * scale;
          }
          std::fill(prow + j1, prow + n, T(0));
          std::fill(drow + j1, drow + n, T(0));
        }
        gemm<T>(true, false, n, HD, rows, T(1), p, n, dOc, ldo, T(1), dv, kv_ld);  // dV += P^T dO
        gemm<T>(false, false, rows, HD, n, T(1), ds, n, k, kv_ld, T(0), dq + static_cast<size_t>(r0) * ld,
                ld);                                                              // dQ = dS K
        gemm<T>(true, false, n, HD, rows, T(1), ds, n, qc, ld, T(1), dk, kv_ld);  // dK += dS^T Q
      }
    }
  }
}

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int NH, int NKV, int HD) {
  const int32_t* pos = positions(T_);
  attention_forward<T>(out, lse, qkv, qkv + static_cast<size_t>(NH) * HD, (NH + 2 * NKV) * HD, {pos, pos, nullptr}, B,
                       T_, T_, NH, NKV, HD);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int T_, int NH,
                        int NKV, int HD) {
  const int32_t* pos = positions(T_);
  const size_t kv = static_cast<size_t>(NH) * HD;
  attention_backward<T>(dqkv, dqkv + kv, dout, qkv, qkv + kv, (NH + 2 * NKV) * HD, out, lse, {pos, pos, nullptr}, B,
                        T_, T_, NH, NKV, HD);
}

template <typename T>
void attention_combine(T* out, T* lse, const T* part, const T* part_lse, int B, int T_, int NH, int HD) {
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    for (int t = 0; t < T_; t++) {
      T& l = lse[static_cast<size_t>(bh) * T_ + t];
      const T p = part_lse[static_cast<size_t>(bh) * T_ + t];
      const T m = std::max(l, p);
      if (m == -std::numeric_limits<T>::infinity()) continue;  // no key in either
      const T w_old = std::exp(l - m), w_new = std::exp(p - m), inv = T(1) / (w_old + w_new);
      const size_t row = (static_cast<size_t>(b) * T_ + t) * NH * HD + static_cast<size_t>(h) * HD;
#pragma omp simd
      for (int d = 0; d < HD; d++) out[row + d] = (out[row + d] * w_old + part[row + d] * w_new) * inv;
      l = m + std::log(w_old + w_new);
    }
  }
}

template <typename T>
void copy_columns(T* dst, int dst_ld, const T* src, int src_ld, int rows, int width) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++)
    std::copy_n(src + static_cast<size_t>(r) * src_ld, width, dst + static_cast<size_t>(r) * dst_ld);
}

#define TRIDENT_ATTENTION(T)                                                                                        \
  template void attention_forward<T>(T*, T*, const T*, const T*, int, const AttentionMask&, int, int, int, int, int, \
                                     int);                                                                           \
  template void attention_backward<T>(T*, T*, const T*, const T*, const T*, int, const T*, const T*,                 \
                                      const AttentionMask&, int, int, int, int, int, int);                           \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, int);                                     \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const T*, int, int, int, int, int);       \
  template void attention_combine<T>(T*, T*, const T*, const T*, int, int, int, int);                              \
  template void copy_columns<T>(T*, int, const T*, int, int, int);
TRIDENT_ATTENTION(float)
TRIDENT_ATTENTION(double)
#undef TRIDENT_ATTENTION

}  // namespace trident::kernels::cpu
