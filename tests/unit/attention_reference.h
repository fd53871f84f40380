// Causal grouped-query attention in float64, forward and backward, straight from the
// definitions: the reference of the CUDA attention kernels' CPU tests.
// qkv[B, T, (NH + 2 NKV) HD] rows [q NH | k NKV | v NKV]; query head h reads key/value
// head h / (NH / NKV); out and dout [B, T, NH HD]; lse [B, NH, T]; dK and dV of a
// key/value head are summed over the query heads of its group.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace trident::kernels::test {

struct AttentionReference {
  std::vector<double> out, lse, dqkv;
};

inline AttentionReference reference_attention(const std::vector<double>& qkv, const std::vector<double>& dout, int B,
                                              int T, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const size_t W = size_t(NH + 2 * NKV) * HD, O = size_t(NH) * HD;
  AttentionReference r;
  r.out.assign(size_t(B) * T * O, 0.0);
  r.lse.assign(size_t(B) * NH * T, 0.0);
  r.dqkv.assign(size_t(B) * T * W, 0.0);
  const double scale = 1.0 / std::sqrt(double(HD));
  std::vector<double> P(size_t(T) * T), dS(size_t(T) * T), dP(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int kv = h / group;
      const size_t qc = size_t(h) * HD, kc = size_t(NH + kv) * HD, vc = size_t(NH + NKV + kv) * HD;
      const auto at = [&](int i, size_t column) { return (size_t(b) * T + i) * W + column; };
      const auto q = [&](int i, int d) { return qkv[at(i, qc + d)]; };
      const auto k = [&](int i, int d) { return qkv[at(i, kc + d)]; };
      const auto v = [&](int i, int d) { return qkv[at(i, vc + d)]; };
      const auto dO = [&](int i, int d) { return dout[(size_t(b) * T + i) * O + qc + d]; };
      std::fill(P.begin(), P.end(), 0.0);
      std::fill(dS.begin(), dS.end(), 0.0);
      for (int i = 0; i < T; i++) {
        double m = -1e300;
        for (int j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < HD; d++) s += q(i, d) * k(j, d);
          P[size_t(i) * T + j] = s * scale;
          m = std::max(m, s * scale);
        }
        double l = 0;
        for (int j = 0; j <= i; j++) l += std::exp(P[size_t(i) * T + j] - m);
        for (int j = 0; j <= i; j++) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - m) / l;
        r.lse[(size_t(b) * NH + h) * T + i] = m + std::log(l);
        double row_term = 0;
        for (int j = 0; j <= i; j++) {
          dP[j] = 0;
          for (int d = 0; d < HD; d++) dP[j] += dO(i, d) * v(j, d);
          row_term += P[size_t(i) * T + j] * dP[j];
        }
        for (int j = 0; j <= i; j++) dS[size_t(i) * T + j] = P[size_t(i) * T + j] * (dP[j] - row_term) * scale;
        for (int d = 0; d < HD; d++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += P[size_t(i) * T + j] * v(j, d);
          r.out[(size_t(b) * T + i) * O + qc + d] = o;
        }
      }
      for (int i = 0; i < T; i++)
        for (int d = 0; d < HD; d++) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j <= i; j++) dq += dS[size_t(i) * T + j] * k(j, d);
          for (int row = i; row < T; row++) {
            dk += dS[size_t(row) * T + i] * q(row, d);
            dv += P[size_t(row) * T + i] * dO(row, d);
          }
          r.dqkv[at(i, qc + d)] = dq;
          r.dqkv[at(i, kc + d)] += dk;  // summed over the group's query heads
          r.dqkv[at(i, vc + d)] += dv;
        }
    }
  return r;
}

// Largest absolute errors of one part of a result, and the largest reference value.
struct PartError {
  double error = 0, largest = 0;
  bool unwritten = false;  // a NaN where a value belongs
  void add(double want, double got) {
    unwritten |= std::isnan(got);
    error = std::max(error, std::abs(want - got));
    largest = std::max(largest, std::abs(want));
  }
};

struct AttentionErrors {
  PartError out, lse, dq, dk, dv;
};

// got_* as float64: the kernels' outputs converted.
inline AttentionErrors compare_attention(const AttentionReference& want, const std::vector<double>& out,
                                         const std::vector<double>& lse, const std::vector<double>& dqkv, int B, int T,
                                         int NH, int NKV, int HD) {
  AttentionErrors e;
  const size_t rows = size_t(B) * T;
  if (out.size() != want.out.size() || lse.size() != want.lse.size() || dqkv.size() != want.dqkv.size() ||
      want.dqkv.size() != rows * (NH + 2 * NKV) * HD || want.out.empty()) {
    ADD_FAILURE() << "attention results of other sizes than the reference's: out " << out.size() << " vs "
                  << want.out.size() << ", lse " << lse.size() << " vs " << want.lse.size() << ", dqkv " << dqkv.size()
                  << " vs " << want.dqkv.size();
    for (PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv}) part->error = std::numeric_limits<double>::infinity();
    return e;
  }
  for (size_t i = 0; i < want.out.size(); i++) e.out.add(want.out[i], out[i]);
  for (size_t i = 0; i < want.lse.size(); i++) e.lse.add(want.lse[i], lse[i]);
  const size_t W = size_t(NH + 2 * NKV) * HD;
  for (size_t i = 0; i < rows * W; i++) {
    const size_t column = i % W;
    PartError& part = column < size_t(NH) * HD ? e.dq : column < size_t(NH + NKV) * HD ? e.dk : e.dv;
    part.add(want.dqkv[i], dqkv[i]);
  }
  return e;
}

}  // namespace trident::kernels::test
