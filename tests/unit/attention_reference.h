// Masked grouped-query attention in float64, forward and backward, straight from the
// definitions (kernels/ops.def, kernels/attention_mask.h): the reference of the CUDA
// attention kernels' CPU tests, and the cases they share (the tests run the kernels
// through callbacks: test_scalar_attention.cpp, test_tensor_core_attention.cpp).
//
// A problem in compact layouts: q and dout [B, Tq, NH HD], kv [B, Tk, 2 NKV HD] (key/value
// head g's k at column g HD, its v at (NKV + g) HD). Query head h reads key/value head
// h / (NH / NKV); key j is visible to query i of sequence b iff kv_pos[j] <= q_pos[i] and
// kv_pos[j] >= doc_start[b, i] (no document mask when doc_start is empty). The reference
// takes positions in any order (the kernels: increasing), so two key blocks may be
// joined. Results: out [B, Tq, NH HD] (0 in a row that sees no key), lse [B, NH, Tq]
// (-inf there), dq [B, Tq, NH HD], dkv [B, Tk, 2 NKV HD] (dK and dV of a key/value head
// summed over the query heads of its group).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_mask.h"

namespace trident::kernels::test {

struct AttentionProblem {
  int B = 1, Tq = 0, Tk = 0, NH = 1, NKV = 1, HD = 0;
  std::vector<double> q, kv, dout;
  std::vector<int32_t> q_pos, kv_pos, doc_start;  // doc_start [B, Tq], or empty
};

struct AttentionReference {
  std::vector<double> out, lse, dq, dkv;
};

inline AttentionReference reference_attention(const AttentionProblem& p) {
  const int B = p.B, Tq = p.Tq, Tk = p.Tk, NH = p.NH, NKV = p.NKV, HD = p.HD, group = NH / NKV;
  const size_t O = size_t(NH) * HD, KV = size_t(2 * NKV) * HD;
  AttentionReference r;
  r.out.assign(size_t(B) * Tq * O, 0.0);
  r.lse.assign(size_t(B) * NH * Tq, -std::numeric_limits<double>::infinity());
  r.dq.assign(size_t(B) * Tq * O, 0.0);
  r.dkv.assign(size_t(B) * Tk * KV, 0.0);
  const double scale = 1.0 / std::sqrt(double(HD));
  std::vector<double> P(Tk), dP(Tk);
  std::vector<char> visible(Tk);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int g = h / group;
      const double* q0 = p.q.data() + size_t(b) * Tq * O + size_t(h) * HD;
      const double* dO0 = p.dout.data() + size_t(b) * Tq * O + size_t(h) * HD;
      const double* k0 = p.kv.data() + size_t(b) * Tk * KV + size_t(g) * HD;
      const double* v0 = p.kv.data() + size_t(b) * Tk * KV + size_t(NKV + g) * HD;
      double* dk0 = r.dkv.data() + size_t(b) * Tk * KV + size_t(g) * HD;
      double* dv0 = r.dkv.data() + size_t(b) * Tk * KV + size_t(NKV + g) * HD;
      for (int i = 0; i < Tq; i++) {
        const double* q = q0 + size_t(i) * O;
        const double* dO = dO0 + size_t(i) * O;
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < Tk; j++) {
          visible[j] = p.kv_pos[j] <= p.q_pos[i] && (p.doc_start.empty() || p.kv_pos[j] >= p.doc_start[size_t(b) * Tq + i]);
          if (!visible[j]) continue;
          double s = 0;
          for (int d = 0; d < HD; d++) s += q[d] * k0[size_t(j) * KV + d];
          P[j] = s * scale;
          m = std::max(m, P[j]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // sees no key
        double l = 0;
        for (int j = 0; j < Tk; j++)
          if (visible[j]) l += std::exp(P[j] - m);
        r.lse[(size_t(b) * NH + h) * Tq + i] = m + std::log(l);
        double row_term = 0;
        for (int j = 0; j < Tk; j++) {
          if (!visible[j]) continue;
          P[j] = std::exp(P[j] - m) / l;
          dP[j] = 0;
          for (int d = 0; d < HD; d++) dP[j] += dO[d] * v0[size_t(j) * KV + d];
          row_term += P[j] * dP[j];
        }
        double* o = r.out.data() + (size_t(b) * Tq + i) * O + size_t(h) * HD;
        double* dq = r.dq.data() + (size_t(b) * Tq + i) * O + size_t(h) * HD;
        for (int j = 0; j < Tk; j++) {
          if (!visible[j]) continue;
          const double dS = P[j] * (dP[j] - row_term) * scale;
          for (int d = 0; d < HD; d++) {
            o[d] += P[j] * v0[size_t(j) * KV + d];
            dq[d] += dS * k0[size_t(j) * KV + d];
            dk0[size_t(j) * KV + d] += dS * q[d];
            dv0[size_t(j) * KV + d] += P[j] * dO[d];
          }
        }
      }
    }
  return r;
}

// The problem with the keys of `a` followed by those of `b` (the same queries): a row's
// attention over both blocks at once, as context parallelism combines it.
inline AttentionProblem join_key_blocks(const AttentionProblem& a, const AttentionProblem& b) {
  AttentionProblem j = a;
  j.Tk = a.Tk + b.Tk;
  const size_t KV = size_t(2 * a.NKV) * a.HD;
  j.kv.clear();
  for (int s = 0; s < a.B; s++) {
    j.kv.insert(j.kv.end(), a.kv.begin() + s * a.Tk * KV, a.kv.begin() + (s + 1) * a.Tk * KV);
    j.kv.insert(j.kv.end(), b.kv.begin() + s * b.Tk * KV, b.kv.begin() + (s + 1) * b.Tk * KV);
  }
  j.kv_pos.insert(j.kv_pos.end(), b.kv_pos.begin(), b.kv_pos.end());
  return j;
}

// Largest absolute errors of one part of a result, and the largest reference value.
struct PartError {
  double error = 0, largest = 0;
  bool unwritten = false;  // a NaN where a value belongs
  void add(double want, double got) {
    if (std::isnan(got)) {
      unwritten = true;
      return;
    }
    if (want == got) return;  // -inf == -inf included
    const double e = std::abs(want - got);
    error = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(error, e);
    if (std::isfinite(want)) largest = std::max(largest, std::abs(want));
  }
};

struct AttentionErrors {
  PartError out, lse, dq, dk, dv;
};

inline AttentionErrors compare_attention(const AttentionReference& want, const AttentionReference& got, int NKV,
                                         int HD) {
  AttentionErrors e;
  if (got.out.size() != want.out.size() || got.lse.size() != want.lse.size() || got.dq.size() != want.dq.size() ||
      got.dkv.size() != want.dkv.size()) {
    ADD_FAILURE() << "attention results of other sizes than the reference's";
    for (PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv}) part->error = std::numeric_limits<double>::infinity();
    return e;
  }
  for (size_t i = 0; i < want.out.size(); i++) e.out.add(want.out[i], got.out[i]);
  for (size_t i = 0; i < want.lse.size(); i++) e.lse.add(want.lse[i], got.lse[i]);
  for (size_t i = 0; i < want.dq.size(); i++) e.dq.add(want.dq[i], got.dq[i]);
  const size_t KV = size_t(2 * NKV) * HD;
  for (size_t i = 0; i < want.dkv.size(); i++) (i % KV < KV / 2 ? e.dk : e.dv).add(want.dkv[i], got.dkv[i]);
  return e;
}

// ---- tiles the kernels should visit ----------------------------------------------------

// Tiles a query-block kernel (forward, dQ) loads per head: for each block of `rows` query
// rows of each sequence, the key tiles of `tile` keys over the hull of its rows' visible
// keys [first kv_pos >= the first row's doc_start, first kv_pos > the last row's q_pos).
inline long expected_key_tiles(const AttentionProblem& p, int rows, int tile) {
  long tiles = 0;
  for (int b = 0; b < p.B; b++)
    for (int q0 = 0; q0 < p.Tq; q0 += rows) {
      const int last = std::min(q0 + rows, p.Tq) - 1;
      const int32_t first_pos = p.doc_start.empty() ? std::numeric_limits<int32_t>::min() : p.doc_start[size_t(b) * p.Tq + q0];
      const long begin = std::lower_bound(p.kv_pos.begin(), p.kv_pos.end(), first_pos) - p.kv_pos.begin();
      const long end = std::upper_bound(p.kv_pos.begin(), p.kv_pos.end(), p.q_pos[last]) - p.kv_pos.begin();
      if (end > begin) tiles += (end - begin + tile - 1) / tile;
    }
  return tiles;
}

// Tiles the dK/dV kernel loads per query head: for each block of `rows` keys, the query
// tiles of `tile` rows over [first q_pos >= the first key's kv_pos, first doc_start >
// the last key's kv_pos).
inline long expected_query_tiles(const AttentionProblem& p, int rows, int tile) {
  long tiles = 0;
  for (int b = 0; b < p.B; b++)
    for (int k0 = 0; k0 < p.Tk; k0 += rows) {
      const int last = std::min(k0 + rows, p.Tk) - 1;
      const long begin = std::lower_bound(p.q_pos.begin(), p.q_pos.end(), p.kv_pos[k0]) - p.q_pos.begin();
      long end = p.Tq;
      if (!p.doc_start.empty()) {
        const auto row = p.doc_start.begin() + size_t(b) * p.Tq;
        end = std::upper_bound(row, row + p.Tq, p.kv_pos[last]) - row;
      }
      if (end > begin) tiles += (end - begin + tile - 1) / tile;
    }
  return tiles;
}

// ---- the cases, and the kernels' operands ---------------------------------------------

// Random document boundaries: the documents of each sequence's positions pos (increasing)
// are runs of 1 .. max_len positions; doc_start[b, i] is where query i's document starts.
// max_len >= the span: one document over the whole sequence.
inline std::vector<int32_t> random_documents(const std::vector<int32_t>& pos, int B, int max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, max_len);
  std::vector<int32_t> starts(size_t(B) * pos.size());
  for (int b = 0; b < B; b++) {
    int32_t start = pos.empty() ? 0 : pos.front() - length(rng) / 2, next = start + length(rng);
    for (size_t i = 0; i < pos.size(); i++) {
      while (pos[i] >= next) start = next, next = start + length(rng);
      starts[b * pos.size() + i] = start;
    }
  }
  return starts;
}

inline std::vector<int32_t> positions(int n, int first = 0, int step = 1) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; i++) p[i] = first + i * step;
  return p;
}

// One kernel call's operands as kernels/ops.def lays them out, in element type E: q in
// qkv's q columns; k and v in qkv's own k, v columns (own_keys: Tk == Tq, kv_ld = qkv's
// width) or in a buffer of their own (kv_ld = 2 NKV HD, qkv's k, v columns NaN: never
// read). Outputs start as NaN, so a value never written shows.
template <typename E>
struct AttentionOperands {
  int B, Tq, Tk, NH, NKV, HD, kv_ld;
  bool own_keys;
  std::vector<E> qkv, kv_block, dout, out, dqkv, dkv_block;
  std::vector<float> lse, delta;
  std::vector<int32_t> q_pos, kv_pos, doc_start;

  size_t width() const { return size_t(NH + 2 * NKV) * HD; }
  const E* kv() const { return own_keys ? qkv.data() + size_t(NH) * HD : kv_block.data(); }
  E* dkv() { return own_keys ? dqkv.data() + size_t(NH) * HD : dkv_block.data(); }
  AttentionMask mask() const { return {q_pos.data(), kv_pos.data(), doc_start.empty() ? nullptr : doc_start.data()}; }
};

// to_e: float to E (rounding); to_f: E to float.
template <typename E>
struct ElementType {
  std::function<E(float)> to_e;
  std::function<float(E)> to_f;
};

// The operands of problem p (its values already representable in E).
template <typename E>
AttentionOperands<E> operands_of(const AttentionProblem& p, bool own_keys, const ElementType<E>& t) {
  AttentionOperands<E> x{p.B, p.Tq, p.Tk, p.NH, p.NKV, p.HD, 0, own_keys, {}, {}, {}, {}, {}, {}, {}, {},
                         p.q_pos, p.kv_pos, p.doc_start};
  const size_t W = x.width(), O = size_t(p.NH) * p.HD, KV = size_t(2 * p.NKV) * p.HD;
  x.kv_ld = own_keys ? int(W) : int(KV);
  const E nan = t.to_e(NAN);
  x.qkv.assign(size_t(p.B) * p.Tq * W, nan);
  for (size_t r = 0; r < size_t(p.B) * p.Tq; r++)
    for (size_t c = 0; c < O; c++) x.qkv[r * W + c] = t.to_e(float(p.q[r * O + c]));
  if (own_keys) {
    for (size_t r = 0; r < size_t(p.B) * p.Tq; r++)
      for (size_t c = 0; c < KV; c++) x.qkv[r * W + O + c] = t.to_e(float(p.kv[r * KV + c]));
  } else {
    x.kv_block.resize(p.kv.size());
    for (size_t i = 0; i < p.kv.size(); i++) x.kv_block[i] = t.to_e(float(p.kv[i]));
    x.dkv_block.assign(p.kv.size(), nan);
  }
  x.dout.resize(p.dout.size());
  for (size_t i = 0; i < p.dout.size(); i++) x.dout[i] = t.to_e(float(p.dout[i]));
  x.out.assign(size_t(p.B) * p.Tq * O, nan);
  x.dqkv.assign(size_t(p.B) * p.Tq * W, nan);
  x.lse.assign(size_t(p.B) * p.NH * p.Tq, NAN);
  x.delta.assign(size_t(p.B) * p.NH * p.Tq, NAN);
  return x;
}

// A random problem of values representable in E: q, k, v ~ N(0, 1.5^2), dout ~ N(0, 1).
template <typename E>
AttentionProblem random_problem(int B, int Tq, int Tk, int NH, int NKV, int HD, std::vector<int32_t> q_pos,
                                std::vector<int32_t> kv_pos, std::vector<int32_t> doc_start, uint32_t seed,
                                const ElementType<E>& t) {
  AttentionProblem p{B, Tq, Tk, NH, NKV, HD, {}, {}, {}, std::move(q_pos), std::move(kv_pos), std::move(doc_start)};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto value = [&](float sd) { return double(t.to_f(t.to_e(sd * normal(rng)))); };
  p.q.resize(size_t(B) * Tq * NH * HD);
  p.kv.resize(size_t(B) * Tk * 2 * NKV * HD);
  p.dout.resize(p.q.size());
  for (double& x : p.q) x = value(1.5f);
  for (double& x : p.kv) x = value(1.5f);
  for (double& x : p.dout) x = value(1.0f);
  return p;
}

// Another rank's block of Tk keys at kv_pos for the queries of `own` (its q, dout and
// documents): random k, v.
template <typename E>
AttentionProblem other_block(const AttentionProblem& own, int Tk, std::vector<int32_t> kv_pos, uint32_t seed,
                             const ElementType<E>& t) {
  AttentionProblem p = random_problem(own.B, own.Tq, Tk, own.NH, own.NKV, own.HD, own.q_pos, std::move(kv_pos),
                                      own.doc_start, seed, t);
  p.q = own.q;
  p.dout = own.dout;
  return p;
}

// The results the kernels left in x, in the compact layouts.
template <typename E>
AttentionReference results_of(AttentionOperands<E>& x, const ElementType<E>& t) {
  const size_t W = x.width(), O = size_t(x.NH) * x.HD, KV = size_t(2 * x.NKV) * x.HD;
  AttentionReference r;
  for (E v : x.out) r.out.push_back(t.to_f(v));
  for (float v : x.lse) r.lse.push_back(v);
  for (size_t row = 0; row < size_t(x.B) * x.Tq; row++)
    for (size_t c = 0; c < O; c++) r.dq.push_back(t.to_f(x.dqkv[row * W + c]));
  const E* dkv = x.dkv();
  for (size_t row = 0; row < size_t(x.B) * x.Tk; row++)
    for (size_t c = 0; c < KV; c++) r.dkv.push_back(t.to_f(dkv[row * x.kv_ld + c]));
  return r;
}

// A separate key block's backward must leave qkv's k, v columns of dqkv alone.
template <typename E>
bool kv_columns_of_dqkv_untouched(const AttentionOperands<E>& x, const ElementType<E>& t) {
  if (x.own_keys) return true;
  const size_t W = x.width(), O = size_t(x.NH) * x.HD;
  for (size_t row = 0; row < size_t(x.B) * x.Tq; row++)
    for (size_t c = O; c < W; c++)
      if (!std::isnan(t.to_f(x.dqkv[row * W + c]))) return false;
  return true;
}

// The kernels under test: forward (out, lse from qkv, kv) and backward (dq into dqkv,
// dk and dv into dkv, from out and lse as they are in x; delta is the callback's).
template <typename E>
struct AttentionKernels {
  std::function<void(AttentionOperands<E>&)> forward, backward;
};

// One call's forward and backward against the reference.
template <typename E>
AttentionErrors run_case(const AttentionProblem& p, bool own_keys, const AttentionKernels<E>& k,
                         const ElementType<E>& t) {
  AttentionOperands<E> x = operands_of(p, own_keys, t);
  k.forward(x);
  k.backward(x);
  EXPECT_TRUE(kv_columns_of_dqkv_untouched(x, t)) << "the backward of a separate key block wrote into qkv's k, v";
  return compare_attention(reference_attention(p), results_of(x, t), p.NKV, p.HD);
}

// Context parallelism's combination: the same queries attend to their own keys (`own`,
// Tk == Tq, kv in qkv) and to another rank's block (`other`, a separate buffer). Each
// block's forward runs alone; out and lse are combined over both (in float64, then
// rounded to E); each block's backward runs with the combined out and lse; dq is the sum
// of the two blocks'. Against the reference over both blocks joined.
template <typename E>
AttentionErrors run_two_blocks(const AttentionProblem& own, const AttentionProblem& other,
                               const AttentionKernels<E>& k, const ElementType<E>& t) {
  AttentionOperands<E> a = operands_of(own, true, t), b = operands_of(other, false, t);
  k.forward(a);
  k.forward(b);
  const double inf = std::numeric_limits<double>::infinity();
  const size_t O = size_t(own.NH) * own.HD;
  for (int s = 0; s < own.B; s++)
    for (int h = 0; h < own.NH; h++)
      for (int i = 0; i < own.Tq; i++) {
        const size_t at = (size_t(s) * own.NH + h) * own.Tq + i;
        const double la = a.lse[at], lb = b.lse[at], m = std::max(la, lb);
        const double lse = m == -inf ? -inf : m + std::log(std::exp(la - m) + std::exp(lb - m));
        const double wa = m == -inf ? 0 : std::exp(la - lse), wb = m == -inf ? 0 : std::exp(lb - lse);
        for (int d = 0; d < own.HD; d++) {
          const size_t o = (size_t(s) * own.Tq + i) * O + size_t(h) * own.HD + d;
          const E combined = t.to_e(float(wa * t.to_f(a.out[o]) + wb * t.to_f(b.out[o])));
          a.out[o] = b.out[o] = combined;
        }
        a.lse[at] = b.lse[at] = float(lse);
      }
  k.backward(a);
  k.backward(b);
  EXPECT_TRUE(kv_columns_of_dqkv_untouched(b, t)) << "the backward of a separate key block wrote into qkv's k, v";
  AttentionReference got = results_of(a, t), got_b = results_of(b, t);
  for (size_t i = 0; i < got.dq.size(); i++) got.dq[i] += got_b.dq[i];
  const size_t KV = size_t(2 * own.NKV) * own.HD;
  std::vector<double> dkv;
  for (int s = 0; s < own.B; s++) {
    dkv.insert(dkv.end(), got.dkv.begin() + s * own.Tk * KV, got.dkv.begin() + (s + 1) * own.Tk * KV);
    dkv.insert(dkv.end(), got_b.dkv.begin() + s * other.Tk * KV, got_b.dkv.begin() + (s + 1) * other.Tk * KV);
  }
  got.dkv = std::move(dkv);  // got.out, got.lse: the combined ones
  return compare_attention(reference_attention(join_key_blocks(own, other)), got, own.NKV, own.HD);
}

}  // namespace trident::kernels::test
