// Checks of the CPU kernels (kernels/cpu/cpu_kernels.h).
//
// Backward kernels are checked against central finite differences in double: the
// double instantiation uses a plain-loop GEMM and std::exp/std::tanh, so the only
// error left is the one of the finite differences themselves. For each kernel we set
// L = sum(out * R) with a fixed random R, so dout = R, and compare the analytic
// gradient with (L(x + h) - L(x - h)) / 2h, h = 1e-6, per input element.
//
// Tolerance: ||analytic - numeric|| / ||numeric|| < 1e-6. With h = 1e-6 the truncation
// error is ~h^2 * |L'''| ~ 1e-12; the rounding error of L is ~1e-16 * |out| per output
// that moves (L is summed in long double, so its magnitude does not enter), divided
// by 2h: ~1e-10. 1e-6 leaves a margin of 1e4 over the rounding error, while a wrong
// term in a gradient gives an error of order 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "model/document_mask.h"

namespace {

using namespace trident::kernels::cpu;
using Vec = std::vector<double>;

constexpr double kH = 1e-6;
constexpr double kFdTol = 1e-6;
// float kernels use a vectorized exp/tanh (a few ulps) and oneDNN's sgemm; 1e-5 is
// ~100 float ulps, far below what a wrong formula would give.
constexpr double kFloatTol = 1e-5;

std::mt19937_64& rng() {
  static std::mt19937_64 gen(20240607);
  return gen;
}

Vec uniform(size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = dist(rng());
  return v;
}

std::vector<int32_t> random_ints(size_t n, int32_t hi) {
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng());
  return v;
}

// sum(a * b) in long double: keeps the rounding of L below what the FD step resolves.
long double dot(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << "dot of " << a.size() << " values with " << b.size();
    return std::numeric_limits<long double>::quiet_NaN();
  }
  long double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<long double>(a[i]) * b[i];
  return s;
}

// ||got - want|| / ||want|| (absolute when want is 0); of different sizes, or empty: a
// failure, and an error no tolerance accepts.
template <typename A, typename B>
double rel_error(const A& got, const B& want) {
  if (got.size() != want.size() || want.empty()) {
    ADD_FAILURE() << "rel_error of " << got.size() << " values against " << want.size();
    return std::numeric_limits<double>::infinity();
  }
  long double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const long double d = static_cast<long double>(got[i]) - static_cast<long double>(want[i]);
    diff += d * d;
    norm += static_cast<long double>(want[i]) * want[i];
  }
  if (norm == 0) return std::sqrt(static_cast<double>(diff));
  return std::sqrt(static_cast<double>(diff / norm));
}

std::vector<float> to_float(const Vec& v) { return {v.begin(), v.end()}; }

// The one FD helper: compares analytic[i] with the central difference of loss() w.r.t.
// x[i], for i in idx (every element when idx is empty). x is restored afterwards.
void expect_grad(const std::string& what, Vec& x, const Vec& analytic,
                 const std::function<long double()>& loss, std::vector<size_t> idx = {},
                 double tol = kFdTol) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  if (idx.empty()) {
    idx.resize(x.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
  }
  // The thousands of forwards run on one thread: each is tiny, and with other processes
  // on the cores every OpenMP barrier can cost milliseconds. The backward under test
  // has already run with all threads.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Vec got, want;
  for (size_t i : idx) {
    const double x0 = x[i];
    x[i] = x0 + kH;
    const long double lp = loss();
    x[i] = x0 - kH;
    const long double lm = loss();
    x[i] = x0;
    want.push_back(static_cast<double>((lp - lm) / (2 * kH)));
    got.push_back(analytic[i]);
  }
  omp_set_num_threads(threads);
  const double err = rel_error(got, want);
  EXPECT_LT(err, tol) << what << ": relative error " << err << " over " << idx.size() << " elements";
}

// ---------------------------------------------------------------------------------------
// Finite differences, double precision
// ---------------------------------------------------------------------------------------

TEST(KernelFiniteDifference, EmbeddingShardAndPositions) {
  // The token table is the shard of rows [3, 7) of a 9-word vocabulary; tokens 0..2 and
  // 7..8 belong to other shards. C = 20 is not a multiple of the backward's 16-channel
  // blocks; tokens repeat, so rows of dwte accumulate from several positions, and shard
  // rows 4 and 5 stay unused. The shard lies between guard rows in one buffer, and the
  // FD runs over the whole buffer: a read of a guard row shows up as a numeric gradient,
  // a write to one as an analytic gradient. wpe has rows beyond T, which must stay out.
  const int B = 2, T = 5, C = 20, vocab_start = 3, shard_rows = 4, guard = 3, max_t = 8;
  const std::vector<int32_t> tokens = {3, 1, 6, 3, 0, 7, 6, 8, 3, 2};
  auto in_shard = [&](int32_t tok) { return tok >= vocab_start && tok < vocab_start + shard_rows; };
  const size_t shard_offset = static_cast<size_t>(guard) * C;
  Vec wte_buf = uniform(static_cast<size_t>(shard_rows + 2 * guard) * C);
  Vec wpe = uniform(static_cast<size_t>(max_t) * C);
  const Vec R = uniform(static_cast<size_t>(B) * T * C);

  // Forward overwrites: rows of tokens outside the shard are exactly 0, the others copy
  // their row exactly.
  Vec out(R.size(), std::numeric_limits<double>::quiet_NaN());
  embedding_forward(out.data(), tokens.data(), wte_buf.data() + shard_offset, vocab_start, shard_rows, B, T, C);
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) {
      const double want =
          in_shard(tokens[i]) ? wte_buf[shard_offset + static_cast<size_t>(tokens[i] - vocab_start) * C + c] : 0.0;
      ASSERT_EQ(out[static_cast<size_t>(i) * C + c], want) << "position " << i << " (token " << tokens[i]
                                                           << ") channel " << c;
    }

  // Positions in reverse (a context-parallel rank's rows are not 0..T-1 either).
  std::vector<int32_t> positions(T);
  for (int t = 0; t < T; t++) positions[t] = T - 1 - t;
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte_buf.data() + shard_offset, vocab_start, shard_rows, B, T, C);
    add_positions(out.data(), wpe.data(), positions.data(), B, T, C);
    return dot(out, R);
  };
  Vec dwte_buf(wte_buf.size(), 0.0), dwpe(wpe.size(), 0.0);
  embedding_backward(dwte_buf.data() + shard_offset, R.data(), tokens.data(), vocab_start, shard_rows, B, T, C);
  positions_backward(dwpe.data(), R.data(), positions.data(), B, T, C);
  expect_grad("dwte shard (with guard rows)", wte_buf, dwte_buf, loss);
  expect_grad("dwpe", wpe, dwpe, loss);
}

TEST(KernelFiniteDifference, LayerNorm) {
  // An offset mean checks the two-pass variance; C = 33 is not a SIMD multiple.
  const int N = 4, C = 33;
  const double eps = 1e-5;
  Vec inp = uniform(static_cast<size_t>(N) * C, 2.0, 4.0);
  Vec weight = uniform(C, 0.5, 1.5), bias = uniform(C);
  const Vec R = uniform(inp.size());
  Vec out(inp.size()), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C, eps);
    return dot(out, R);
  };
  loss();  // mean and rstd of the unperturbed input, for the backward
  Vec dinp(inp.size(), 0.0), dweight(C, 0.0), dbias(C, 0.0);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  expect_grad("dinp", inp, dinp, loss);
  expect_grad("dweight", weight, dweight, loss);
  expect_grad("dbias", bias, dbias, loss);
}

TEST(KernelFiniteDifference, MatmulWithBias) {
  // OC = 70 crosses the 64-column blocks of the dbias sums.
  const int N = 3, C = 5, OC = 70;
  Vec inp = uniform(static_cast<size_t>(N) * C), weight = uniform(static_cast<size_t>(OC) * C);
  Vec bias = uniform(OC);
  const Vec R = uniform(static_cast<size_t>(N) * OC);
  Vec out(R.size());
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return dot(out, R);
  };
  Vec dinp(inp.size(), 0.0), dweight(weight.size(), 0.0), dbias(OC, 0.0);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(), weight.data(), N, C, OC);
  expect_grad("dinp", inp, dinp, loss);
  expect_grad("dweight", weight, dweight, loss);
  expect_grad("dbias", bias, dbias, loss);
}

TEST(KernelFiniteDifference, MatmulWithoutBias) {
  const int N = 6, C = 7, OC = 9;
  Vec inp = uniform(static_cast<size_t>(N) * C), weight = uniform(static_cast<size_t>(OC) * C);
  const Vec R = uniform(static_cast<size_t>(N) * OC);
  Vec out(R.size());
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), static_cast<const double*>(nullptr), N, C, OC);
    return dot(out, R);
  };
  Vec dinp(inp.size(), 0.0), dweight(weight.size(), 0.0);
  matmul_backward(dinp.data(), dweight.data(), static_cast<double*>(nullptr), R.data(), inp.data(),
                  weight.data(), N, C, OC);
  expect_grad("dinp", inp, dinp, loss);
  expect_grad("dweight", weight, dweight, loss);

  // dinp == null skips dinp only (the first layer has no input gradient to compute).
  Vec dweight_only(weight.size(), 0.0);
  matmul_backward(static_cast<double*>(nullptr), dweight_only.data(), static_cast<double*>(nullptr),
                  R.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_EQ(dweight_only, dweight);
}

// FD of attention over qkv. Perturbing every element costs 2 forwards each, so large T
// checks a sample: random elements plus every element of the rows around the
// 128-row chunk boundary (127, 128) and of the last row. NKV < NH: grouped-query
// attention, each key/value head shared by NH / NKV query heads.
void check_attention(int B, int T, int NH, int hd, size_t samples, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int width = (NH + 2 * NKV) * hd;
  Vec qkv = uniform(static_cast<size_t>(B) * T * width, -1.5, 1.5);
  const Vec R = uniform(static_cast<size_t>(B) * T * NH * hd);
  Vec out(R.size()), probs(static_cast<size_t>(B) * NH * T * T, 0.0);
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), qkv.data(), B, T, NH, NKV, hd);
    return dot(out, R);
  };
  loss();  // probs of the unperturbed input, for the backward
  Vec dqkv(qkv.size(), 0.0);
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), probs.data(), B, T, NH, NKV, hd);

  std::vector<size_t> idx;
  if (samples > 0 && samples < qkv.size()) {
    std::uniform_int_distribution<size_t> pick(0, qkv.size() - 1);
    for (size_t s = 0; s < samples; s++) idx.push_back(pick(rng()));
    for (int b = 0; b < B; b++)
      for (int t : {127, 128, T - 1})
        if (t < T)
          for (int c = 0; c < width; c++) idx.push_back((static_cast<size_t>(b) * T + t) * width + c);
  }
  expect_grad("dqkv B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                  " NKV=" + std::to_string(NKV),
              qkv, dqkv, loss, idx);
}

TEST(KernelFiniteDifference, AttentionSmall) { check_attention(2, 7, 3, 2, 0); }

TEST(KernelFiniteDifference, AttentionTwoChunks) {
  // T = 130: query rows 128..129 form a second chunk; dk/dv of the first chunk's keys
  // get contributions from both chunks.
  check_attention(2, 130, 2, 4, 400);
}

TEST(KernelFiniteDifference, AttentionThreeChunks) { check_attention(1, 300, 2, 2, 300); }

TEST(KernelFiniteDifference, GroupedQueryAttention) {
  check_attention(2, 9, 6, 4, 0, 3);  // groups of 2 query heads
  check_attention(2, 7, 4, 2, 0, 1);  // multi-query: one key/value head for all
  check_attention(1, 130, 4, 2, 300, 2);  // two chunks, dk/dv summed over heads and chunks
}

// ---- masked attention (kernels/attention_mask.h): document masks, key blocks of other ranks ----

// Attention straight from the definition, dense, in float64: query i of sequence b sees
// key j iff kv_pos[j] <= q_pos[i] and kv_pos[j] >= doc_start[b, i] (no document test when
// doc_start is empty). Rows that see no key: out 0, lse -inf.
struct DenseAttention {
  Vec out, lse;
};
DenseAttention dense_masked_attention(const Vec& qkv, const Vec& kv, int kv_ld, const std::vector<int32_t>& q_pos,
                                      const std::vector<int32_t>& kv_pos, const std::vector<int32_t>& doc_start,
                                      int B, int Tq, int Tk, int NH, int NKV, int hd) {
  const int width = (NH + 2 * NKV) * hd, group = NH / NKV;
  DenseAttention r{Vec(static_cast<size_t>(B) * Tq * NH * hd, 0.0),
                   Vec(static_cast<size_t>(B) * NH * Tq, -std::numeric_limits<double>::infinity())};
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < Tq; i++) {
        const int g = h / group;
        const double* q = &qkv[(static_cast<size_t>(b) * Tq + i) * width + h * hd];
        std::vector<double> score(Tk, 0.0);
        std::vector<bool> seen(Tk, false);
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < Tk; j++) {
          seen[j] = kv_pos[j] <= q_pos[i] && (doc_start.empty() || kv_pos[j] >= doc_start[b * Tq + i]);
          if (!seen[j]) continue;
          const double* k = &kv[(static_cast<size_t>(b) * Tk + j) * kv_ld + g * hd];
          for (int d = 0; d < hd; d++) score[j] += q[d] * k[d] / std::sqrt(static_cast<double>(hd));
          max = std::max(max, score[j]);
        }
        if (max == -std::numeric_limits<double>::infinity()) continue;
        double sum = 0;
        for (int j = 0; j < Tk; j++) sum += seen[j] ? std::exp(score[j] - max) : 0.0;
        r.lse[(static_cast<size_t>(b) * NH + h) * Tq + i] = max + std::log(sum);
        for (int j = 0; j < Tk; j++) {
          if (!seen[j]) continue;
          const double* v = &kv[(static_cast<size_t>(b) * Tk + j) * kv_ld + (NKV + g) * hd];
          for (int d = 0; d < hd; d++)
            r.out[(static_cast<size_t>(b) * Tq + i) * NH * hd + h * hd + d] += std::exp(score[j] - max) / sum * v[d];
        }
      }
  return r;
}

// Random elements of x plus every element of the given rows (of `width` each).
std::vector<size_t> sample_elements(size_t n, size_t samples, int width, std::initializer_list<int> rows) {
  std::vector<size_t> idx;
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  for (size_t s = 0; s < samples; s++) idx.push_back(pick(rng()));
  for (int row : rows)
    for (int c = 0; c < width; c++)
      if (static_cast<size_t>(row) * width + c < n) idx.push_back(static_cast<size_t>(row) * width + c);
  return idx;
}

// The masked flash kernel against the dense definition (out, lse), and its backward
// against finite differences of its forward, for q rows of qkv over a block of keys.
void check_masked_attention(const std::string& what, Vec& qkv, Vec& kv, int kv_ld, bool kv_in_qkv,
                            const std::vector<int32_t>& q_pos, const std::vector<int32_t>& kv_pos,
                            const std::vector<int32_t>& doc_start, int B, int Tq, int Tk, int NH, int NKV, int hd,
                            size_t samples, std::initializer_list<int> rows) {
  SCOPED_TRACE(what);
  const trident::kernels::AttentionMask mask{q_pos.data(), kv_pos.data(),
                                              doc_start.empty() ? nullptr : doc_start.data()};
  const size_t kv_column = static_cast<size_t>(NH) * hd;
  const auto kv_of = [&] { return kv_in_qkv ? qkv.data() + kv_column : kv.data(); };
  const Vec R = uniform(static_cast<size_t>(B) * Tq * NH * hd);
  Vec out(R.size()), lse(static_cast<size_t>(B) * NH * Tq);
  auto loss = [&] {
    attention_forward(out.data(), lse.data(), qkv.data(), kv_of(), kv_ld, mask, B, Tq, Tk, NH, NKV, hd);
    return dot(out, R);
  };
  loss();
  const DenseAttention want =
      dense_masked_attention(qkv, kv_in_qkv ? Vec(qkv.begin() + kv_column, qkv.end()) : kv, kv_ld, q_pos, kv_pos,
                             doc_start, B, Tq, Tk, NH, NKV, hd);
  EXPECT_LT(rel_error(out, want.out), 1e-13);
  for (size_t i = 0; i < lse.size(); i++) {
    if (std::isinf(want.lse[i])) EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i;
    else EXPECT_NEAR(lse[i], want.lse[i], 1e-12) << "row " << i;
  }
  Vec dqkv(qkv.size(), 0.0), dkv(kv.size(), 0.0);
  attention_backward(dqkv.data(), kv_in_qkv ? dqkv.data() + kv_column : dkv.data(), R.data(), qkv.data(), kv_of(),
                     kv_ld, out.data(), lse.data(), mask, B, Tq, Tk, NH, NKV, hd);
  for (double g : dqkv) ASSERT_TRUE(std::isfinite(g));
  for (double g : dkv) ASSERT_TRUE(std::isfinite(g));
  const int width = (NH + 2 * NKV) * hd;
  expect_grad(what + " dqkv", qkv, dqkv, loss, sample_elements(qkv.size(), samples, width, rows));
  if (!kv_in_qkv) expect_grad(what + " dkv", kv, dkv, loss, sample_elements(kv.size(), samples, kv_ld, rows));
}

// Tokens of B rows of T: documents of random lengths in [1, max_length] (each ending with
// `eod`), and in row 0 one document over [long_from, long_to] (every chunk of the row).
std::vector<int32_t> packed_documents(int B, int T, int max_length, int32_t eod, int long_from, int long_to) {
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T, 1);
  std::uniform_int_distribution<int> length(1, max_length);
  for (int b = 0; b < B; b++)
    for (int i = length(rng()) - 1; i < T; i += length(rng())) tokens[static_cast<size_t>(b) * T + i] = eod;
  std::fill(tokens.begin() + long_from, tokens.begin() + long_to, 1);
  tokens[long_from] = tokens[long_to] = eod;
  return tokens;
}

TEST(MaskedAttention, DocumentsMatchTheDenseDefinitionAndFiniteDifferences) {
  // 300 positions: three row chunks of the kernel (128); documents of 1-6 tokens (far
  // shorter than a chunk) and, in row 0, one from 20 to 280 across all three chunks.
  const int B = 2, T = 300, NH = 4, NKV = 2, hd = 4, width = (NH + 2 * NKV) * hd;
  const std::vector<int32_t> tokens = packed_documents(B, T, 6, 7, 20, 280);
  std::vector<int32_t> starts(tokens.size()), positions(T);
  trident::document_starts(tokens.data(), B, T, 7, starts.data());
  std::iota(positions.begin(), positions.end(), 0);
  ASSERT_EQ(starts[200], 21);  // the long document (its start: one past the end token at 20)
  Vec qkv = uniform(static_cast<size_t>(B) * T * width, -1.5, 1.5), unused;
  check_masked_attention("documents", qkv, unused, width, true, positions, positions, starts, B, T, T, NH, NKV, hd,
                         120, {127, 128, 200, T + 5});
  // Without document starts: plain causal attention, the same kernel.
  check_masked_attention("causal", qkv, unused, width, true, positions, positions, {}, B, T, T, NH, NKV, hd, 100,
                         {127, 128});
}

TEST(MaskedAttention, KeyBlockOfAnotherRankMatchesTheDenseDefinitionAndFiniteDifferences) {
  // Context parallelism's shapes: a sequence of 4 chunks of 40 over 2 ranks; rank 0's
  // queries (chunks 0 and 3) against rank 1's keys (chunks 1 and 2), in a buffer of their
  // own ([k | v] rows). Chunk 0's rows see none of them (out 0, lse -inf, no NaN);
  // chunk 3's see all, but for documents.
  const int B = 2, C = 40, NH = 4, NKV = 2, hd = 4, width = (NH + 2 * NKV) * hd, kv_ld = 2 * NKV * hd;
  std::vector<int32_t> q_pos, kv_pos;
  for (int i = 0; i < C; i++) q_pos.push_back(i);
  for (int i = 0; i < 2 * C; i++) kv_pos.push_back(C + i);
  for (int i = 0; i < C; i++) q_pos.push_back(3 * C + i);
  const int Tq = 2 * C, Tk = 2 * C, T = 4 * C;
  const std::vector<int32_t> tokens = packed_documents(B, T, 30, 7, 50, 150);
  std::vector<int32_t> global_starts(tokens.size()), starts;
  trident::document_starts(tokens.data(), B, T, 7, global_starts.data());
  for (int b = 0; b < B; b++)
    for (int32_t p : q_pos) starts.push_back(global_starts[static_cast<size_t>(b) * T + p]);
  Vec qkv = uniform(static_cast<size_t>(B) * Tq * width, -1.5, 1.5), kv = uniform(static_cast<size_t>(B) * Tk * kv_ld);
  check_masked_attention("documents", qkv, kv, kv_ld, false, q_pos, kv_pos, starts, B, Tq, Tk, NH, NKV, hd, 300,
                         {0, 39, 40, Tq + 45});
  check_masked_attention("causal", qkv, kv, kv_ld, false, q_pos, kv_pos, {}, B, Tq, Tk, NH, NKV, hd, 100, {40});
  // A block wholly in the causal future of every query: nothing seen, nothing flows back.
  const std::vector<int32_t> first_chunk(q_pos.begin(), q_pos.begin() + C);
  Vec out(static_cast<size_t>(B) * C * NH * hd, 1.0), lse(static_cast<size_t>(B) * NH * C, 1.0);
  Vec dq(qkv.size(), 1.0), dkv(kv.size(), 1.0);
  const trident::kernels::AttentionMask future{first_chunk.data(), kv_pos.data(), nullptr};
  attention_forward(out.data(), lse.data(), qkv.data(), kv.data(), kv_ld, future, B, C, Tk, NH, NKV, hd);
  attention_backward(dq.data(), dkv.data(), out.data(), qkv.data(), kv.data(), kv_ld, out.data(), lse.data(), future,
                     B, C, Tk, NH, NKV, hd);
  for (double x : out) ASSERT_EQ(x, 0.0);
  for (double x : lse) ASSERT_TRUE(std::isinf(x) && x < 0);
  for (double x : dkv) ASSERT_EQ(x, 0.0);
  for (int row = 0; row < B * C; row++)
    for (int c = 0; c < NH * hd; c++) ASSERT_EQ(dq[static_cast<size_t>(row) * width + c], 0.0);
}

TEST(MaskedAttention, KeyBlocksCombinedByTheirLogSumExpsEqualTheWhole) {
  // The ring's algebra on one rank: the keys of a sequence in two blocks ([k | v] buffers
  // of their own), each block's attention merged by attention_combine, equal attention
  // over all keys; each block's backward with the merged out and lse gives exact parts:
  // dq sums over the blocks, dk and dv are the whole's rows of that block. Documents on.
  const int B = 2, T = 150, NH = 4, NKV = 2, hd = 4, width = (NH + 2 * NKV) * hd, kv_ld = 2 * NKV * hd;
  const std::vector<int32_t> tokens = packed_documents(B, T, 40, 7, 30, 120);
  std::vector<int32_t> starts(tokens.size()), positions(T);
  trident::document_starts(tokens.data(), B, T, 7, starts.data());
  std::iota(positions.begin(), positions.end(), 0);
  const Vec qkv = uniform(static_cast<size_t>(B) * T * width), dout = uniform(static_cast<size_t>(B) * T * NH * hd);
  const int half = 70;  // block 0: keys 0..69, block 1: 70..149
  std::vector<Vec> block(2);
  std::vector<std::vector<int32_t>> block_pos(2);
  for (int t = 0; t < T; t++) block_pos[t >= half].push_back(t);
  for (int k = 0; k < 2; k++)
    for (int b = 0; b < B; b++)
      for (int32_t t : block_pos[k])
        for (int c = 0; c < kv_ld; c++) block[k].push_back(qkv[(static_cast<size_t>(b) * T + t) * width + NH * hd + c]);
  const auto mask_for = [&](const std::vector<int32_t>& kv_pos) {
    return trident::kernels::AttentionMask{positions.data(), kv_pos.data(), starts.data()};
  };
  Vec whole(dout.size()), whole_lse(static_cast<size_t>(B) * NH * T), dwhole(qkv.size(), 0.0);
  attention_forward(whole.data(), whole_lse.data(), qkv.data(), qkv.data() + NH * hd, width, mask_for(positions), B, T,
                    T, NH, NKV, hd);
  attention_backward(dwhole.data(), dwhole.data() + NH * hd, dout.data(), qkv.data(), qkv.data() + NH * hd, width,
                     whole.data(), whole_lse.data(), mask_for(positions), B, T, T, NH, NKV, hd);
  Vec out(dout.size()), lse(whole_lse.size()), part(dout.size()), part_lse(lse.size());
  for (int k = 0; k < 2; k++) {
    const int Tk = static_cast<int>(block_pos[k].size());
    attention_forward(k == 0 ? out.data() : part.data(), k == 0 ? lse.data() : part_lse.data(), qkv.data(),
                      block[k].data(), kv_ld, mask_for(block_pos[k]), B, T, Tk, NH, NKV, hd);
  }
  attention_combine(out.data(), lse.data(), part.data(), part_lse.data(), B, T, NH, hd);
  EXPECT_LT(rel_error(out, whole), 1e-13);
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], whole_lse[i], 1e-12) << "row " << i;
  Vec dq(qkv.size(), 0.0);
  for (int k = 0; k < 2; k++) {
    const int Tk = static_cast<int>(block_pos[k].size());
    Vec dq_part(qkv.size(), 0.0), dkv(block[k].size(), 0.0);
    attention_backward(dq_part.data(), dkv.data(), dout.data(), qkv.data(), block[k].data(), kv_ld, out.data(),
                       lse.data(), mask_for(block_pos[k]), B, T, Tk, NH, NKV, hd);
    for (size_t i = 0; i < dq.size(); i++) dq[i] += dq_part[i];
    for (int b = 0; b < B; b++)
      for (int j = 0; j < Tk; j++)
        for (int c = 0; c < kv_ld; c++)
          ASSERT_NEAR(dkv[(static_cast<size_t>(b) * Tk + j) * kv_ld + c],
                      dwhole[(static_cast<size_t>(b) * T + block_pos[k][j]) * width + NH * hd + c], 1e-12)
              << "block " << k << " key " << j;
  }
  for (size_t row = 0; row < static_cast<size_t>(B) * T; row++)
    for (int c = 0; c < NH * hd; c++) ASSERT_NEAR(dq[row * width + c], dwhole[row * width + c], 1e-12) << "row " << row;
}

TEST(KernelConventions, GroupedQueryAttentionEqualsRepeatedHeads) {
  // GQA reads each shared key/value head in place; the same attention with the shared
  // heads copied out to every query head (what PyTorch's repeat_interleave does) gives
  // the same output, and dk/dv are the sums of the copies' gradients.
  const int B = 2, T = 11, NH = 6, NKV = 2, hd = 4, group = NH / NKV;
  const int width = (NH + 2 * NKV) * hd, wide = 3 * NH * hd;
  const Vec qkv = uniform(static_cast<size_t>(B) * T * width);
  Vec repeated(static_cast<size_t>(B) * T * wide);
  for (int bt = 0; bt < B * T; bt++)
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hd; d++) {
        const size_t src = static_cast<size_t>(bt) * width, dst = static_cast<size_t>(bt) * wide;
        const int kv = h / group;
        repeated[dst + h * hd + d] = qkv[src + h * hd + d];
        repeated[dst + (NH + h) * hd + d] = qkv[src + (NH + kv) * hd + d];
        repeated[dst + (2 * NH + h) * hd + d] = qkv[src + (NH + NKV + kv) * hd + d];
      }
  const Vec dout = uniform(static_cast<size_t>(B) * T * NH * hd);
  Vec out(dout.size()), out_rep(dout.size()), probs(static_cast<size_t>(B) * NH * T * T), probs_rep(probs.size());
  attention_forward(out.data(), probs.data(), qkv.data(), B, T, NH, NKV, hd);
  attention_forward(out_rep.data(), probs_rep.data(), repeated.data(), B, T, NH, NH, hd);
  EXPECT_LT(rel_error(out, out_rep), 1e-14);
  Vec dqkv(qkv.size()), drep(repeated.size());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), probs.data(), B, T, NH, NKV, hd);
  attention_backward(drep.data(), dout.data(), repeated.data(), out_rep.data(), probs_rep.data(), B, T, NH, NH, hd);
  Vec summed(qkv.size(), 0.0);
  for (int bt = 0; bt < B * T; bt++)
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hd; d++) {
        const size_t dst = static_cast<size_t>(bt) * width, src = static_cast<size_t>(bt) * wide;
        const int kv = h / group;
        summed[dst + h * hd + d] = drep[src + h * hd + d];
        summed[dst + (NH + kv) * hd + d] += drep[src + (NH + h) * hd + d];
        summed[dst + (NH + NKV + kv) * hd + d] += drep[src + (2 * NH + h) * hd + d];
      }
  EXPECT_LT(rel_error(dqkv, summed), 1e-13);
}

TEST(KernelFiniteDifference, RmsNorm) {
  // C = 33 is not a SIMD multiple; inputs away from 0 and near it.
  const int N = 5, C = 33;
  const double eps = 1e-5;
  Vec inp = uniform(static_cast<size_t>(N) * C, -2.0, 3.0);
  Vec weight = uniform(C, 0.5, 1.5);
  const Vec R = uniform(inp.size());
  Vec out(inp.size()), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
    return dot(out, R);
  };
  loss();
  // The forward against the formula, row by row.
  for (int i = 0; i < N; i++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += inp[i * C + c] * inp[i * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; c++) ASSERT_NEAR(out[i * C + c], inp[i * C + c] * s * weight[c], 1e-14);
  }
  Vec dinp(inp.size(), 0.0), dweight(C, 0.0);
  rmsnorm_backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(), rstd.data(), N, C);
  expect_grad("dinp", inp, dinp, loss);
  expect_grad("dweight", weight, dweight, loss);
}

// cos and sin of t * theta^(-2i/hd), as the model's rotary table holds them.
Vec rope_table(int T, int hd, double theta) {
  Vec table(static_cast<size_t>(T) * hd);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < hd / 2; i++) {
      const double angle = t * std::pow(theta, -2.0 * i / hd);
      table[static_cast<size_t>(t) * hd + 2 * i] = std::cos(angle);
      table[static_cast<size_t>(t) * hd + 2 * i + 1] = std::sin(angle);
    }
  return table;
}

TEST(KernelFiniteDifference, RotaryEmbeddings) {
  // q and k heads turn, v heads do not. Against Hugging Face's formula
  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), then FD of the backward.
  const int B = 2, T = 5, NH = 4, NKV = 2, hd = 6, width = (NH + 2 * NKV) * hd;
  const Vec table = rope_table(T, hd, 10000.0);
  Vec qkv = uniform(static_cast<size_t>(B) * T * width);
  const Vec R = uniform(qkv.size());
  Vec rotated = qkv;
  rope_forward(rotated.data(), table.data(), B, T, NH, NKV, hd);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH + 2 * NKV; h++)
        for (int d = 0; d < hd; d++) {
          const size_t base = (static_cast<size_t>(b) * T + t) * width + h * hd;
          const int i = d % (hd / 2);
          const double c = std::cos(t * std::pow(10000.0, -2.0 * i / hd)), s = std::sin(t * std::pow(10000.0, -2.0 * i / hd));
          const double half = d < hd / 2 ? -qkv[base + d + hd / 2] : qkv[base + d - hd / 2];
          const double want = h < NH + NKV ? qkv[base + d] * c + half * s : qkv[base + d];
          ASSERT_NEAR(rotated[base + d], want, 1e-14) << "b " << b << " t " << t << " head " << h << " d " << d;
        }
  Vec out(qkv.size());
  auto loss = [&] {
    out = qkv;
    rope_forward(out.data(), table.data(), B, T, NH, NKV, hd);
    return dot(out, R);
  };
  Vec dqkv = R;
  rope_backward(dqkv.data(), table.data(), B, T, NH, NKV, hd);
  expect_grad("dqkv", qkv, dqkv, loss);
}

TEST(KernelFiniteDifference, SwiGlu) {
  const int N = 7, F = 37;
  Vec gate_up = uniform(static_cast<size_t>(N) * 2 * F, -6.0, 6.0);
  gate_up[0] = 0.0;
  const Vec R = uniform(static_cast<size_t>(N) * F);
  Vec out(R.size());
  auto loss = [&] {
    swiglu_forward(out.data(), gate_up.data(), N, F);
    return dot(out, R);
  };
  loss();
  for (int i = 0; i < N; i++)
    for (int j = 0; j < F; j++) {
      const double g = gate_up[i * 2 * F + j], u = gate_up[i * 2 * F + F + j];
      ASSERT_NEAR(out[i * F + j], g / (1 + std::exp(-g)) * u, 1e-14);
    }
  Vec dgate_up(gate_up.size(), 0.0);
  swiglu_backward(dgate_up.data(), gate_up.data(), R.data(), N, F);
  expect_grad("dgate_up", gate_up, dgate_up, loss);
}

TEST(KernelFiniteDifference, Gelu) {
  // Wide range: the tails (tanh -> +-1) and the middle; include 0 exactly.
  Vec inp = uniform(500, -6.0, 6.0);
  inp[0] = 0.0;
  const Vec R = uniform(inp.size());
  Vec out(inp.size());
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), inp.size());
    return dot(out, R);
  };
  Vec dinp(inp.size(), 0.0);
  gelu_backward(dinp.data(), inp.data(), R.data(), inp.size());
  expect_grad("dinp", inp, dinp, loss);
}

// -log softmax(row[:V])[target], directly.
double direct_ce_loss(const double* row, int V, int target) {
  long double max = row[0];
  for (int j = 1; j < V; j++) max = std::max<long double>(max, row[j]);
  long double sum = 0;
  for (int j = 0; j < V; j++) sum += std::exp(static_cast<long double>(row[j]) - max);
  return static_cast<double>(std::log(sum) + max - row[target]);
}

// Vocabulary-parallel cross-entropy simulated in one process: P shards of Vs columns,
// shard p holding the vocabulary ids [p*Vs, p*Vs + valid), valid = min(Vs, V - p*Vs);
// the rest of its columns is padding, filled with a large value that would dominate
// the softmax if a kernel read it.
constexpr double kPadLogit = 50.0;

struct VocabShard {
  int start, valid;
};

std::vector<VocabShard> vocab_shards(int V, int P, int Vs) {
  std::vector<VocabShard> shards;
  for (int p = 0; p < P; p++) shards.push_back({p * Vs, std::clamp(V - p * Vs, 0, Vs)});
  return shards;
}

template <typename F>
struct ShardedCrossEntropy {
  int N, V, Vs;
  std::vector<VocabShard> shards;
  std::vector<std::vector<F>> logits;    // per shard, [N, Vs]
  std::vector<std::vector<F>> partials;  // per shard, sum_and_target [2N]
  std::vector<F> row_max, sum_and_target, losses, lse;

  ShardedCrossEntropy(int N_, int V_, int P, int Vs_) : N(N_), V(V_), Vs(Vs_), shards(vocab_shards(V_, P, Vs_)) {}

  // Cuts the full logits [N, V] into the shards.
  void set_logits(const Vec& full) {
    logits.assign(shards.size(), std::vector<F>(static_cast<size_t>(N) * Vs, static_cast<F>(kPadLogit)));
    for (size_t p = 0; p < shards.size(); p++)
      for (int i = 0; i < N; i++)
        for (int j = 0; j < shards[p].valid; j++)
          logits[p][static_cast<size_t>(i) * Vs + j] = static_cast<F>(full[static_cast<size_t>(i) * V + shards[p].start + j]);
  }

  // The model's combination: all-reduce max of the row maxima, then every shard sums
  // exp against the global max, all-reduce sum of (sum, target), then the loss.
  void forward(const std::vector<int32_t>& targets) {
    row_max.assign(N, -std::numeric_limits<F>::infinity());
    std::vector<F> shard_max(N);
    for (size_t p = 0; p < shards.size(); p++) {
      logits_row_max(shard_max.data(), logits[p].data(), N, shards[p].valid, Vs);
      for (int i = 0; i < N; i++) row_max[i] = std::max(row_max[i], shard_max[i]);
    }
    sum_and_target.assign(2 * static_cast<size_t>(N), F(0));
    partials.assign(shards.size(), std::vector<F>(2 * static_cast<size_t>(N)));
    for (size_t p = 0; p < shards.size(); p++) {
      logits_sum_exp_and_target(partials[p].data(), logits[p].data(), row_max.data(), targets.data(),
                                shards[p].start, N, shards[p].valid, Vs);
      for (int k = 0; k < 2 * N; k++) sum_and_target[k] += partials[p][k];
    }
    losses.assign(N, F(0));
    lse.assign(N, F(0));
    cross_entropy_loss(losses.data(), lse.data(), row_max.data(), sum_and_target.data(), N);
  }

  // dlogits in place on every shard (after forward); returns them gathered to [N, V].
  Vec backward(const std::vector<int32_t>& targets, F dloss) {
    Vec full(static_cast<size_t>(N) * V);
    for (size_t p = 0; p < shards.size(); p++) {
      cross_entropy_backward(logits[p].data(), lse.data(), targets.data(), shards[p].start, N, shards[p].valid, Vs,
                             dloss);
      for (int i = 0; i < N; i++)
        for (int j = 0; j < shards[p].valid; j++)
          full[static_cast<size_t>(i) * V + shards[p].start + j] = logits[p][static_cast<size_t>(i) * Vs + j];
    }
    return full;
  }

  // After backward: every padded column holds exactly 0.
  void expect_padding_zero(const std::string& what) const {
    for (size_t p = 0; p < shards.size(); p++)
      for (int i = 0; i < N; i++)
        for (int j = shards[p].valid; j < Vs; j++)
          ASSERT_EQ(logits[p][static_cast<size_t>(i) * Vs + j], F(0))
              << what << ": shard " << p << " row " << i << " padded column " << j;
  }
};

void check_sharded_cross_entropy(int V, int P, int Vs, const std::vector<int32_t>& targets) {
  const std::string what = "V=" + std::to_string(V) + " P=" + std::to_string(P) + " Vs=" + std::to_string(Vs);
  const int N = static_cast<int>(targets.size());
  Vec logits = uniform(static_cast<size_t>(N) * V, -3.0, 3.0);
  ShardedCrossEntropy<double> ce(N, V, P, Vs);
  // The backward takes one scalar dloss for all rows, so L = dloss * sum(losses).
  const double dloss = 0.37;
  const Vec ones(N, 1.0);
  auto loss = [&] {
    ce.set_logits(logits);
    ce.forward(targets);
    return dloss * dot(ce.losses, ones);
  };
  loss();

  for (int i = 0; i < N; i++) {
    const double* row = &logits[static_cast<size_t>(i) * V];
    // The combined max is the max of the real words (padding never read), exactly.
    EXPECT_EQ(ce.row_max[i], *std::max_element(row, row + V)) << what << " row " << i;
    // Exactly one shard reports the target's logit; the others report exactly 0.
    for (size_t p = 0; p < ce.shards.size(); p++) {
      const int column = targets[i] - ce.shards[p].start;
      const bool owns = column >= 0 && column < ce.shards[p].valid;
      EXPECT_EQ(ce.partials[p][N + i], owns ? row[targets[i]] : 0.0) << what << " shard " << p << " row " << i;
    }
    EXPECT_NEAR(ce.losses[i], direct_ce_loss(row, V, targets[i]), 1e-12) << what << " row " << i;
    EXPECT_NEAR(ce.lse[i], ce.losses[i] + row[targets[i]], 1e-12) << what << " row " << i;
  }

  const Vec dlogits = ce.backward(targets, dloss);
  ce.expect_padding_zero(what);
  expect_grad("dlogits " + what, logits, dlogits, loss);
}

TEST(KernelFiniteDifference, CrossEntropyThreeShards) {
  // V = 37 over 3 shards of 16 columns: the last holds 5 words and 11 padded columns.
  // Targets at both edges of every shard.
  check_sharded_cross_entropy(37, 3, 16, {0, 36, 15, 16, 31, 32, 5, 20, 5});
}

TEST(KernelFiniteDifference, CrossEntropyOneShard) {
  // tp = 1: one shard holding the whole vocabulary, padded from 37 to 48 columns.
  check_sharded_cross_entropy(37, 1, 48, {0, 36, 5, 17, 5});
}

// ---------------------------------------------------------------------------------------
// Accumulate (+=) vs overwrite conventions of kernels/kernels.h
// ---------------------------------------------------------------------------------------

TEST(KernelConventions, MatmulBackwardTwiceDoublesParameterGrads) {
  const int N = 4, C = 6, OC = 5;
  const Vec inp = uniform(static_cast<size_t>(N) * C), weight = uniform(static_cast<size_t>(OC) * C);
  const Vec dout = uniform(static_cast<size_t>(N) * OC);
  Vec dinp(inp.size(), 0.0), dweight(weight.size(), 0.0), dbias(OC, 0.0);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  const Vec dinp1 = dinp, dweight1 = dweight, dbias1 = dbias;
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  for (size_t i = 0; i < dweight.size(); i++) EXPECT_DOUBLE_EQ(dweight[i], 2 * dweight1[i]);
  for (int i = 0; i < OC; i++) EXPECT_DOUBLE_EQ(dbias[i], 2 * dbias1[i]);
  EXPECT_EQ(dinp, dinp1);  // overwritten, not accumulated
}

TEST(KernelConventions, LayerNormBackwardAccumulatesEverything) {
  const int N = 3, C = 10;
  const Vec inp = uniform(static_cast<size_t>(N) * C), weight = uniform(C), bias = uniform(C);
  const Vec dout = uniform(inp.size());
  Vec out(inp.size()), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C, 1e-5);
  Vec dinp(inp.size(), 0.0), dweight(C, 0.0), dbias(C, 0.0);
  auto backward = [&] {
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                       mean.data(), rstd.data(), N, C);
  };
  backward();
  const Vec dinp1 = dinp, dweight1 = dweight, dbias1 = dbias;
  backward();
  for (size_t i = 0; i < dinp.size(); i++) EXPECT_DOUBLE_EQ(dinp[i], 2 * dinp1[i]);
  for (int i = 0; i < C; i++) {
    EXPECT_DOUBLE_EQ(dweight[i], 2 * dweight1[i]);
    EXPECT_DOUBLE_EQ(dbias[i], 2 * dbias1[i]);
  }
}

TEST(KernelConventions, EmbeddingAndPositionsBackwardAccumulate) {
  // C = 37 crosses the backward's 16-channel blocks; token 9 lies outside the shard [1, 5).
  const int B = 2, T = 3, C = 37, vocab_start = 1, shard_rows = 4;
  const std::vector<int32_t> positions = {0, 1, 2};
  const std::vector<int32_t> tokens = {2, 0, 2, 4, 9, 1};
  const Vec dout = uniform(static_cast<size_t>(B) * T * C);
  Vec dwte(static_cast<size_t>(shard_rows) * C, 0.0), dwpe(static_cast<size_t>(T) * C, 0.0);
  embedding_backward(dwte.data(), dout.data(), tokens.data(), vocab_start, shard_rows, B, T, C);
  positions_backward(dwpe.data(), dout.data(), positions.data(), B, T, C);
  const Vec dwte1 = dwte, dwpe1 = dwpe;
  embedding_backward(dwte.data(), dout.data(), tokens.data(), vocab_start, shard_rows, B, T, C);
  positions_backward(dwpe.data(), dout.data(), positions.data(), B, T, C);
  for (size_t i = 0; i < dwte.size(); i++) EXPECT_DOUBLE_EQ(dwte[i], 2 * dwte1[i]);
  for (size_t i = 0; i < dwpe.size(); i++) EXPECT_DOUBLE_EQ(dwpe[i], 2 * dwpe1[i]);

  // The shard sits at its place in a table of the whole vocabulary [0, 10), filled with
  // old contents: rows of other shards (tokens 0 and 9 among them) and shard rows that no
  // token hits (row 2, token 3) keep them exactly; the others get their sum added.
  const int vocab = 10;
  const Vec table_old = uniform(static_cast<size_t>(vocab) * C);
  Vec table = table_old;
  embedding_backward(table.data() + static_cast<size_t>(vocab_start) * C, dout.data(), tokens.data(), vocab_start,
                     shard_rows, B, T, C);
  for (int tok = 0; tok < vocab; tok++)
    for (int c = 0; c < C; c++) {
      const size_t k = static_cast<size_t>(tok) * C + c;
      const int r = tok - vocab_start;
      if (r < 0 || r >= shard_rows || r == 2)
        EXPECT_EQ(table[k], table_old[k]) << "untouched row of token " << tok << " channel " << c;
      else
        EXPECT_NEAR(table[k], table_old[k] + dwte1[static_cast<size_t>(r) * C + c], 1e-14)
            << "row of token " << tok << " channel " << c;
    }

  // add_positions adds wpe[t] to what is there.
  const Vec wpe = uniform(static_cast<size_t>(T) * C), base = uniform(dout.size());
  Vec out = base;
  add_positions(out.data(), wpe.data(), positions.data(), B, T, C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        const size_t k = (static_cast<size_t>(b) * T + t) * C + c;
        EXPECT_EQ(out[k], base[k] + wpe[static_cast<size_t>(t) * C + c]) << "b " << b << " t " << t << " c " << c;
      }
}

TEST(KernelConventions, EmbeddingShardsTogetherGiveTheFullTable) {
  // Vocabulary 10 over 3 shards of 4 rows (the last padded): the sum of the shards'
  // outputs is the unsharded output, and the shards' dwte are the unsharded dwte, exactly.
  const int B = 2, T = 6, C = 19, V = 10, rows = 4, P = 3;
  const std::vector<int32_t> tokens = random_ints(static_cast<size_t>(B) * T, V);
  Vec wte = uniform(static_cast<size_t>(P) * rows * C);  // rows V.. are padding
  const Vec dout = uniform(static_cast<size_t>(B) * T * C);
  Vec full_out(dout.size()), full_dwte(wte.size(), 0.0);
  embedding_forward(full_out.data(), tokens.data(), wte.data(), 0, V, B, T, C);
  embedding_backward(full_dwte.data(), dout.data(), tokens.data(), 0, V, B, T, C);

  Vec sum_out(dout.size(), 0.0), shard_out(dout.size()), dwte(wte.size(), 0.0);
  for (int p = 0; p < P; p++) {
    const size_t offset = static_cast<size_t>(p) * rows * C;
    embedding_forward(shard_out.data(), tokens.data(), wte.data() + offset, p * rows, rows, B, T, C);
    for (size_t k = 0; k < sum_out.size(); k++) sum_out[k] += shard_out[k];
    embedding_backward(dwte.data() + offset, dout.data(), tokens.data(), p * rows, rows, B, T, C);
  }
  EXPECT_EQ(sum_out, full_out);
  EXPECT_EQ(dwte, full_dwte);
}

TEST(KernelConventions, OverwrittenOutputsIgnoreOldContents) {
  // dqkv of attention and dinp of gelu are overwritten: start from garbage (NaN) and
  // expect the same result as from zeros.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int B = 2, T = 131, NH = 2, C = 4;
  const Vec qkv = uniform(static_cast<size_t>(B) * T * 3 * C), dout = uniform(static_cast<size_t>(B) * T * C);
  Vec out(dout.size()), probs(static_cast<size_t>(B) * NH * T * T, 0.0);
  attention_forward(out.data(), probs.data(), qkv.data(), B, T, NH, NH, C / NH);
  Vec dqkv_zero(qkv.size(), 0.0), dqkv_nan(qkv.size(), nan);
  attention_backward(dqkv_zero.data(), dout.data(), qkv.data(), out.data(), probs.data(), B, T, NH, NH, C / NH);
  attention_backward(dqkv_nan.data(), dout.data(), qkv.data(), out.data(), probs.data(), B, T, NH, NH, C / NH);
  EXPECT_EQ(dqkv_nan, dqkv_zero);

  const Vec x = uniform(100, -4.0, 4.0), dy = uniform(100);
  Vec dx_zero(100, 0.0), dx_nan(100, nan);
  gelu_backward(dx_zero.data(), x.data(), dy.data(), x.size());
  gelu_backward(dx_nan.data(), x.data(), dy.data(), x.size());
  EXPECT_EQ(dx_nan, dx_zero);
}

// ---------------------------------------------------------------------------------------
// Optimizer and norm
// ---------------------------------------------------------------------------------------

TEST(KernelAdamW, MatchesDirectFormulasOverThreeSteps) {
  const size_t n = 37;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, grad_scale = 0.5;
  Vec p = uniform(n), m(n, 0.0), v(n, 0.0);
  Vec p_ref = p, m_ref = m, v_ref = v;
  for (int t = 1; t <= 3; t++) {
    const Vec grad = uniform(n, -2.0, 2.0);
    adamw_update(p.data(), grad.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t, grad_scale);
    for (size_t i = 0; i < n; i++) {
      const double g = grad[i] * grad_scale;
      p_ref[i] *= 1 - lr * wd;
      m_ref[i] = b1 * m_ref[i] + (1 - b1) * g;
      v_ref[i] = b2 * v_ref[i] + (1 - b2) * g * g;
      p_ref[i] -= lr * (m_ref[i] / (1 - std::pow(b1, t))) / (std::sqrt(v_ref[i] / (1 - std::pow(b2, t))) + eps);
    }
    // Same formulas, possibly another association of the products: a few ulps.
    EXPECT_LT(rel_error(m, m_ref), 1e-14) << "step " << t;
    EXPECT_LT(rel_error(v, v_ref), 1e-14) << "step " << t;
    EXPECT_LT(rel_error(p, p_ref), 1e-14) << "step " << t;
  }
}

TEST(KernelLion, MatchesDirectFormulasOverThreeSteps) {
  const size_t n = 41;
  const double lr = 3e-4, b1 = 0.9, b2 = 0.99, wd = 0.5, grad_scale = 0.5;
  Vec p = uniform(n), m = uniform(n, -0.1, 0.1);
  Vec p_ref = p, m_ref = m;
  for (int t = 1; t <= 3; t++) {
    Vec grad = uniform(n, -2.0, 2.0);
    grad[t] = -m[t] * b1 / ((1 - b1) * grad_scale);  // c exactly 0 (up to rounding): sign 0 or +-1, then lr
    lion_update(p.data(), grad.data(), m.data(), n, lr, b1, b2, wd, grad_scale);
    for (size_t i = 0; i < n; i++) {
      const double g = grad[i] * grad_scale, c = b1 * m_ref[i] + (1 - b1) * g;
      p_ref[i] = p_ref[i] * (1 - lr * wd) - lr * ((c > 0) - (c < 0));
      m_ref[i] = b2 * m_ref[i] + (1 - b2) * g;
    }
    EXPECT_LT(rel_error(m, m_ref), 1e-14) << "step " << t;
    for (size_t i = 0; i < n; i++) EXPECT_NEAR(p[i], p_ref[i], i == static_cast<size_t>(t) ? lr : 1e-15) << i;
  }
  // Every parameter moved by lr (and its decay) alone: the update's size is the sign's.
  Vec one = {0.25}, zero_m = {0.0}, g = {1e-30};
  lion_update(one.data(), g.data(), zero_m.data(), 1, lr, b1, b2, 0.0, 1.0);
  EXPECT_DOUBLE_EQ(one[0], 0.25 - lr);
}

TEST(KernelSumSquares, MatchesDirectSumAcrossBlocks) {
  // n spans several of the kernel's 2^14-element blocks plus a partial one.
  const size_t n = 3 * (size_t{1} << 14) + 123;
  const Vec x = uniform(n, -2.0, 2.0);
  const std::vector<float> xf = to_float(x);
  long double want = 0, want_f = 0;
  for (size_t i = 0; i < n; i++) {
    want += static_cast<long double>(x[i]) * x[i];
    want_f += static_cast<long double>(xf[i]) * xf[i];
  }
  EXPECT_NEAR(sum_squares(x.data(), n), static_cast<double>(want), 1e-13 * static_cast<double>(want));
  // The float instance squares in double (exact for float inputs) and sums in double.
  EXPECT_NEAR(sum_squares(xf.data(), n), static_cast<double>(want_f), 1e-13 * static_cast<double>(want_f));
  EXPECT_EQ(sum_squares(x.data(), 0), 0.0);

  // Fixed blocks summed in order: the same bits for any thread count.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_squares(xf.data(), n);
  omp_set_num_threads(std::max(2, threads));
  const double many = sum_squares(xf.data(), n);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, many);
}

// ---------------------------------------------------------------------------------------
// float instance (fast exp/tanh, oneDNN sgemm) vs double instance on the same inputs
// ---------------------------------------------------------------------------------------

// Rounds through float, so both instances see exactly the same inputs.
Vec float_exact(Vec v) {
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

TEST(KernelFloatVsDouble, Attention) {
  const int B = 2, T = 200, NH = 3, hd = 8, C = NH * hd;
  const Vec qkv = float_exact(uniform(static_cast<size_t>(B) * T * 3 * C, -2.0, 2.0));
  const Vec dout = float_exact(uniform(static_cast<size_t>(B) * T * C));
  const size_t np = static_cast<size_t>(B) * NH * T * T;
  Vec out(dout.size()), probs(np, 0.0), dqkv(qkv.size());
  attention_forward(out.data(), probs.data(), qkv.data(), B, T, NH, NH, C / NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), probs.data(), B, T, NH, NH, hd);

  const std::vector<float> qkv_f = to_float(qkv), dout_f = to_float(dout);
  std::vector<float> out_f(out.size()), probs_f(np, 0.0f), dqkv_f(qkv.size());
  attention_forward(out_f.data(), probs_f.data(), qkv_f.data(), B, T, NH, NH, hd);
  EXPECT_LT(rel_error(out_f, out), kFloatTol);
  EXPECT_LT(rel_error(probs_f, probs), kFloatTol);
  attention_backward(dqkv_f.data(), dout_f.data(), qkv_f.data(), out_f.data(), probs_f.data(), B, T, NH, NH, hd);
  EXPECT_LT(rel_error(dqkv_f, dqkv), kFloatTol);
}

template <typename F>
void check_row_statistics(int B, int T, int NH, int hd, double tol) {
  // Each row's log-sum-exp (what backward recomputes the probabilities from) against the
  // dense causal definition.
  const int C = NH * hd;
  const Vec qkv64 = uniform(static_cast<size_t>(B) * T * 3 * C, -3.0, 3.0);
  const std::vector<F> qkv(qkv64.begin(), qkv64.end());
  std::vector<F> out(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, hd);
  std::vector<int32_t> positions(T);
  std::iota(positions.begin(), positions.end(), 0);
  const DenseAttention want = dense_masked_attention(qkv64, Vec(qkv64.begin() + C, qkv64.end()), 3 * C, positions,
                                                     positions, {}, B, T, T, NH, NH, hd);
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], want.lse[i], tol) << "row " << i;
}

TEST(KernelFloatVsDouble, AttentionRowStatisticsAreTheLogSumExps) {
  check_row_statistics<float>(2, 260, 2, 4, 1e-5);  // ~T float roundings of terms <= 1
  check_row_statistics<double>(2, 260, 2, 4, 1e-12);
}

TEST(KernelFloatVsDouble, Gelu) {
  // Norm-wise error: for x << 0 gelu(x) ~ 0 and float's 1 + tanh cancels, so the
  // element-wise relative error there is large while the absolute error stays ~1e-8.
  const size_t n = 4099;
  const Vec x = float_exact(uniform(n, -6.0, 6.0)), dy = float_exact(uniform(n));
  Vec y(n), dx(n);
  gelu_forward(y.data(), x.data(), n);
  gelu_backward(dx.data(), x.data(), dy.data(), n);
  const std::vector<float> xf = to_float(x), dyf = to_float(dy);
  std::vector<float> yf(n), dxf(n);
  gelu_forward(yf.data(), xf.data(), n);
  gelu_backward(dxf.data(), xf.data(), dyf.data(), n);
  EXPECT_LT(rel_error(yf, y), kFloatTol);
  EXPECT_LT(rel_error(dxf, dx), kFloatTol);
}

TEST(KernelFloatVsDouble, LlamaKernels) {
  // RMSNorm, rotary embeddings, SwiGLU (fast exp) and grouped-query attention in float
  // against double on the same inputs.
  const int B = 2, T = 140, NH = 4, NKV = 2, hd = 8, width = (NH + 2 * NKV) * hd, N = B * T, F = 45;
  const Vec x = float_exact(uniform(static_cast<size_t>(N) * width, -2.0, 2.0));
  const Vec w = float_exact(uniform(width, 0.5, 1.5)), dy = float_exact(uniform(x.size()));
  const std::vector<float> xf = to_float(x), wf = to_float(w), dyf = to_float(dy);
  {
    Vec y(x.size()), rstd(N), dx(x.size(), 0.0), dw(width, 0.0);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, width, 1e-5);
    rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, width);
    std::vector<float> yf(x.size()), rstdf(N), dxf(x.size(), 0.0f), dwf(width, 0.0f);
    rmsnorm_forward(yf.data(), rstdf.data(), xf.data(), wf.data(), N, width, 1e-5f);
    rmsnorm_backward(dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), rstdf.data(), N, width);
    EXPECT_LT(rel_error(yf, y), kFloatTol);
    EXPECT_LT(rel_error(dxf, dx), kFloatTol);
    EXPECT_LT(rel_error(dwf, dw), kFloatTol);
  }
  {
    const Vec table = rope_table(T, hd, 500000.0);
    const std::vector<float> tablef = to_float(table);
    Vec y = x;
    std::vector<float> yf = xf;
    rope_forward(y.data(), table.data(), B, T, NH, NKV, hd);
    rope_forward(yf.data(), tablef.data(), B, T, NH, NKV, hd);
    EXPECT_LT(rel_error(yf, y), kFloatTol);
    rope_backward(y.data(), table.data(), B, T, NH, NKV, hd);  // the transpose undoes the rotation
    EXPECT_LT(rel_error(y, x), 1e-14);
  }
  {
    const Vec gu = float_exact(uniform(static_cast<size_t>(N) * 2 * F, -8.0, 8.0)), d = float_exact(uniform(static_cast<size_t>(N) * F));
    const std::vector<float> guf = to_float(gu), df = to_float(d);
    Vec y(d.size()), dgu(gu.size());
    std::vector<float> yf(d.size()), dguf(gu.size());
    swiglu_forward(y.data(), gu.data(), N, F);
    swiglu_backward(dgu.data(), gu.data(), d.data(), N, F);
    swiglu_forward(yf.data(), guf.data(), N, F);
    swiglu_backward(dguf.data(), guf.data(), df.data(), N, F);
    EXPECT_LT(rel_error(yf, y), kFloatTol);
    EXPECT_LT(rel_error(dguf, dgu), kFloatTol);
  }
  {
    const size_t np = static_cast<size_t>(B) * NH * T * T;
    Vec out(static_cast<size_t>(N) * NH * hd), probs(np, 0.0), dqkv(x.size());
    const Vec dout = float_exact(uniform(out.size()));
    attention_forward(out.data(), probs.data(), x.data(), B, T, NH, NKV, hd);
    attention_backward(dqkv.data(), dout.data(), x.data(), out.data(), probs.data(), B, T, NH, NKV, hd);
    const std::vector<float> doutf = to_float(dout);
    std::vector<float> outf(out.size()), probsf(np, 0.0f), dqkvf(x.size());
    attention_forward(outf.data(), probsf.data(), xf.data(), B, T, NH, NKV, hd);
    attention_backward(dqkvf.data(), doutf.data(), xf.data(), outf.data(), probsf.data(), B, T, NH, NKV, hd);
    EXPECT_LT(rel_error(outf, out), kFloatTol);
    EXPECT_LT(rel_error(dqkvf, dqkv), kFloatTol);
  }
}

TEST(KernelFloatVsDouble, ShardedCrossEntropy) {
  const int N = 8, V = 1000;
  const Vec logits = float_exact(uniform(static_cast<size_t>(N) * V, -8.0, 8.0));
  std::vector<int32_t> targets = random_ints(N, V);
  targets[0] = 0;
  targets[1] = V - 1;
  // (P, Vs): one padded shard; 3 shards (the last holds 296 words); 8 shards of 128.
  for (auto [P, Vs] : {std::pair{1, 1024}, std::pair{3, 352}, std::pair{8, 128}}) {
    const std::string what = "P=" + std::to_string(P) + " Vs=" + std::to_string(Vs);
    ShardedCrossEntropy<double> ce(N, V, P, Vs);
    ce.set_logits(logits);
    ce.forward(targets);
    for (int i = 0; i < N; i++)
      EXPECT_NEAR(ce.losses[i], direct_ce_loss(&logits[static_cast<size_t>(i) * V], V, targets[i]), 1e-12)
          << what << " row " << i;
    const Vec dlogits = ce.backward(targets, 1.0 / N);

    ShardedCrossEntropy<float> ce_f(N, V, P, Vs);
    ce_f.set_logits(logits);
    ce_f.forward(targets);
    EXPECT_LT(rel_error(ce_f.losses, ce.losses), kFloatTol) << what;
    EXPECT_LT(rel_error(ce_f.lse, ce.lse), kFloatTol) << what;
    const Vec dlogits_f = ce_f.backward(targets, 1.0f / N);
    EXPECT_LT(rel_error(dlogits_f, dlogits), kFloatTol) << what;
    ce_f.expect_padding_zero(what);
  }
}

}  // namespace

namespace {

// The sigmoid router where its scores round to 1.0f (logits above ~17): it ranks by logit,
// as the float64 reference does, and its gradient keeps the digits of s (1 - s) there.
TEST(KernelConventions, SaturatedSigmoidRouterRanksByLogit) {
  const int E = 4, K = 2;
  const float logits[E] = {18.0f, 1.0f, 25.0f, 20.0f};  // scores 1.0f, 0.73, 1.0f, 1.0f
  float probs[E], lse[1], weights[K];
  int32_t experts[K];
  moe_router_forward<float>(probs, lse, experts, weights, logits, nullptr, 1, E, K, /*renormalize=*/true, /*sigmoid=*/true);
  EXPECT_EQ(experts[0], 2);
  EXPECT_EQ(experts[1], 3);
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_FLOAT_EQ(weights[1], 0.5f);
  // Not renormalized, only a weight's gradient: d loss / d logit = dw s (1 - s), s (1 - s)
  // = e^-25 / (1 + e^-25)^2 for expert 2, not 0.
  const float dweights[K] = {1.0f, 0.0f};
  float dlogits[E];
  moe_router_forward<float>(probs, lse, experts, weights, logits, nullptr, 1, E, K, /*renormalize=*/false, /*sigmoid=*/true);
  moe_router_backward<float>(dlogits, probs, lse, experts, weights, dweights, /*balance=*/nullptr, 1, 0.0f, 0.0f, 1,
                             E, K, /*renormalize=*/false, /*sigmoid=*/true);
  const double expected = std::exp(-25.0) / std::pow(1 + std::exp(-25.0), 2);
  EXPECT_NEAR(dlogits[2], expected, 1e-6 * expected);
  EXPECT_EQ(dlogits[1], 0.0f);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Grouped linear layers (a mixture's experts): each group's rows through its own weight
// ---------------------------------------------------------------------------------------

namespace trident::kernels::cpu {
namespace {

// The CPU backend's grouped matmuls against float64 sums per group: uneven and empty
// groups, the input-gradient and weight-gradient halves each skipped (null) once.
TEST(GroupedMatmul, EachGroupsRowsGoThroughItsOwnWeight) {
  const std::unique_ptr<Kernels> k = make_kernels(Device::cpu, Precision::fp32);
  const std::vector<int> rows = {3, 0, 5, 0, 2};
  const int groups = static_cast<int>(rows.size()), C = 6, OC = 7, R = 10;
  const auto floats = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> inp = floats(uniform(static_cast<size_t>(R) * C)),
                           dout = floats(uniform(static_cast<size_t>(R) * OC));
  std::vector<std::vector<float>> weight(groups), dweight(groups);
  std::vector<const Act*> weights;
  std::vector<float*> dweights;
  for (int g = 0; g < groups; g++) {
    weight[g] = floats(uniform(static_cast<size_t>(OC) * C));
    dweight[g].assign(weight[g].size(), 1.0f);  // added to
    weights.push_back(as_act(weight[g].data()));
    dweights.push_back(dweight[g].data());
  }
  std::vector<float> out(static_cast<size_t>(R) * OC), dinp(static_cast<size_t>(R) * C, 9.0f);
  k->grouped_matmul_forward(as_act(out.data()), as_act(inp.data()), weights.data(), rows.data(), groups, C, OC);
  k->grouped_matmul_backward(as_act(dinp.data()), nullptr, as_act(dout.data()), nullptr, weights.data(), rows.data(),
                             groups, C, OC);
  k->grouped_matmul_backward(nullptr, dweights.data(), as_act(dout.data()), as_act(inp.data()), nullptr, rows.data(),
                             groups, C, OC);
  int first = 0;
  for (int g = 0; g < groups; g++) {
    for (int r = first; r < first + rows[g]; r++) {
      for (int o = 0; o < OC; o++) {
        double want = 0;
        for (int c = 0; c < C; c++) want += static_cast<double>(inp[r * C + c]) * weight[g][o * C + c];
        EXPECT_NEAR(out[r * OC + o], want, 1e-5) << "group " << g << " row " << r;
      }
      for (int c = 0; c < C; c++) {  // overwritten
        double want = 0;
        for (int o = 0; o < OC; o++) want += static_cast<double>(dout[r * OC + o]) * weight[g][o * C + c];
        EXPECT_NEAR(dinp[r * C + c], want, 1e-5) << "group " << g << " row " << r;
      }
    }
    for (int o = 0; o < OC; o++)
      for (int c = 0; c < C; c++) {  // added to 1: an empty group's stays 1
        double want = 1;
        for (int r = first; r < first + rows[g]; r++) want += static_cast<double>(dout[r * OC + o]) * inp[r * C + c];
        EXPECT_NEAR(dweight[g][o * C + c], want, 1e-5) << "group " << g;
      }
    first += rows[g];
  }
}

}  // namespace
}  // namespace trident::kernels::cpu
