// The scalar flash-attention kernels (kernels/cuda/attention_scalar_kernels.cuh: the CUDA
// path of fp32, and of head dimensions the tensor cores do not take) run on the CPU,
// without a GPU (tests/unit/cuda_simulator.h), against the float64 reference
// (tests/unit/attention_reference.h): plain causal attention, documents packed into a
// sequence (document masking), blocks of another rank's keys (context parallelism:
// shifted positions, Tk != Tq, kv rows of 2 NKV hd), grouped-query attention. Shared
// memory starts as NaN bytes and the outputs as NaN, so a value never written shows; the
// simulator counts the tiles the kernels visit, so skipping them is checked too.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/unit/attention_reference.h"
#include "tests/unit/cuda_simulator.h"

namespace trident::kernels::cuda_sim {
namespace scalar {

#include "kernels/cuda/attention_scalar_kernels.cuh"

template <typename E>
const test::ElementType<E> kElement{[](float x) { return from_float<E>(x); }, [](E x) { return to_float(x); }};

unsigned blocks(int rows) { return static_cast<unsigned>((rows + kRows - 1) / kRows); }

// The launches of attention.cu: kThreads<HD> threads (kRows rows) a block; in the
// backward, delta from row_dot_kernel, then the dK/dV and the dQ kernels.
template <int HD, typename E>
test::AttentionKernels<E> kernels() {
  return {[](test::AttentionOperands<E>& x) {
            const AttentionDims dims{x.Tq, x.Tk, x.NH, x.NKV, x.HD, x.kv_ld};
            launch(blocks(x.Tq), x.B * x.NH, kThreads<HD>, scalar_forward_shared<HD>(), [&] {
              flash_forward_kernel<HD, E>(x.out.data(), x.lse.data(), x.qkv.data(), x.kv(), x.mask(), dims);
            });
          },
          [](test::AttentionOperands<E>& x) {
            const AttentionDims dims{x.Tq, x.Tk, x.NH, x.NKV, x.HD, x.kv_ld};
            const unsigned row_blocks = (x.B * x.NH * x.Tq + 255) / 256;
            launch(row_blocks, 1, 256, 0, [&] {
              row_dot_kernel<E>(x.delta.data(), x.dout.data(), x.out.data(), x.B, x.Tq, x.NH, x.HD);
            });
            launch(blocks(x.Tk), x.B * x.NKV, kThreads<HD>, scalar_backward_kv_shared<HD>(), [&] {
              flash_backward_kv_kernel<HD, E>(x.dkv(), x.dout.data(), x.qkv.data(), x.kv(), x.lse.data(),
                                              x.delta.data(), x.mask(), dims);
            });
            launch(blocks(x.Tq), x.B * x.NH, kThreads<HD>, scalar_backward_q_shared<HD>(), [&] {
              flash_backward_q_kernel<HD, E>(x.dqkv.data(), x.dout.data(), x.qkv.data(), x.kv(), x.lse.data(),
                                             x.delta.data(), x.mask(), dims);
            });
          }};
}

// B sequences of T tokens at positions 0..T-1 attending causally to their own keys.
template <int HD, typename E>
test::AttentionErrors plain(int B, int T, int NH, int NKV, int hd) {
  const auto p = test::random_problem<E>(B, T, T, NH, NKV, hd, test::positions(T), test::positions(T), {},
                                         321 + T + hd + 5 * NKV, kElement<E>);
  return test::run_case(p, true, kernels<HD, E>(), kElement<E>);
}

// tolerance: relative to the largest reference value of each output (at least 1).
void expect_close(const test::AttentionErrors& e, double tolerance, const std::string& what) {
  for (const test::PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv})
    EXPECT_FALSE(part->unwritten) << what << ": an output was never written (or is NaN)";
  EXPECT_LT(e.out.error, tolerance * std::max(1.0, e.out.largest)) << what;
  EXPECT_LT(e.lse.error, 1e-3) << what;
  EXPECT_LT(e.dq.error, tolerance * std::max(1.0, e.dq.largest)) << what;
  EXPECT_LT(e.dk.error, tolerance * std::max(1.0, e.dk.largest)) << what;
  EXPECT_LT(e.dv.error, tolerance * std::max(1.0, e.dv.largest)) << what;
}

constexpr double kFp32 = 1e-4, kBf16 = 0.03;

TEST(ScalarAttentionOnCpu, MultiHeadHeadDim32TwoSequencesPartialTile) {
  expect_close(plain<32, float>(2, 130, 2, 2, 32), kFp32, "NH 2 NKV 2, hd 32, T 130");
}
TEST(ScalarAttentionOnCpu, GroupedQueryHeadDim64) {
  expect_close(plain<64, float>(1, 130, 4, 2, 64), kFp32, "NH 4 NKV 2, hd 64, T 130");
  expect_close(plain<64, float>(1, 1, 4, 2, 64), kFp32, "NH 4 NKV 2, hd 64, T 1");
}
TEST(ScalarAttentionOnCpu, MultiQueryHeadDim48InRegistersOf64) {
  expect_close(plain<64, float>(2, 70, 4, 1, 48), kFp32, "NH 4 NKV 1, hd 48, T 70");
}
TEST(ScalarAttentionOnCpu, GroupedQueryHeadDim128) {
  expect_close(plain<128, float>(1, 64, 6, 2, 128), kFp32, "NH 6 NKV 2, hd 128, T 64");
}
TEST(ScalarAttentionOnCpu, GroupedQueryBf16) {
  expect_close(plain<32, bf16>(1, 100, 4, 2, 32), kBf16, "bf16 NH 4 NKV 2, hd 32, T 100");
  expect_close(plain<32, bf16>(1, 100, 4, 1, 24), kBf16, "bf16 NH 4 NKV 1, hd 24, T 100");
}

// Head dimension 128 (Llama's): a row over 4 lanes of a warp. T 70: the second block of
// rows has 6, so one warp has rows past the sequence and seven have none.
TEST(ScalarAttentionOnCpu, MultiQueryHeadDim128TwoSequencesPartialBlock) {
  expect_close(plain<128, float>(2, 70, 4, 1, 128), kFp32, "NH 4 NKV 1, hd 128, B 2, T 70");
}
TEST(ScalarAttentionOnCpu, GroupsOfFourHeadDim96InRegistersOf128) {
  expect_close(plain<128, float>(1, 70, 8, 2, 96), kFp32, "NH 8 NKV 2, hd 96, T 70");
}
TEST(ScalarAttentionOnCpu, HeadDim128Bf16) {
  expect_close(plain<128, bf16>(1, 45, 4, 1, 128), kBf16, "bf16 NH 4 NKV 1, hd 128, T 45");
  expect_close(plain<128, bf16>(1, 45, 8, 2, 96), kBf16, "bf16 NH 8 NKV 2, hd 96, T 45");
}

// ---- document masking ----------------------------------------------------------------

// Sequence 0: random documents of 1..max_len tokens; sequence 1 (if any): one document
// over the whole sequence.
std::vector<int32_t> documents(const std::vector<int32_t>& pos, int B, int max_len, uint32_t seed) {
  std::vector<int32_t> starts = test::random_documents(pos, 1, max_len, seed);
  for (int b = 1; b < B; b++) starts.insert(starts.end(), pos.size(), pos.front());
  return starts;
}

template <int HD, typename E>
test::AttentionErrors packed(int B, int T, int NH, int NKV, int hd, int max_len) {
  const auto pos = test::positions(T);
  const auto p = test::random_problem<E>(B, T, T, NH, NKV, hd, pos, pos, documents(pos, B, max_len, 7 + T),
                                         99 + T + hd, kElement<E>);
  return test::run_case(p, true, kernels<HD, E>(), kElement<E>);
}

// Documents of 1..20 tokens (shorter than a tile and than a warp's rows) in sequence 0,
// one document over the whole sequence in sequence 1; grouped-query heads.
TEST(ScalarAttentionOnCpu, DocumentMaskShortDocumentsAndOneWholeSequence) {
  expect_close(packed<32, float>(2, 150, 4, 2, 32, 20), kFp32, "documents <= 20, NH 4 NKV 2, hd 32, T 150");
  expect_close(packed<64, float>(1, 100, 2, 1, 40, 90), kFp32, "documents <= 90, NH 2 NKV 1, hd 40, T 100");
}
TEST(ScalarAttentionOnCpu, DocumentMaskBf16HeadDim128) {
  expect_close(packed<128, bf16>(2, 70, 4, 2, 128, 12), kBf16, "bf16 documents <= 12, NH 4 NKV 2, hd 128, T 70");
}

// Tokens a few at a time in documents far shorter than a tile: every block loads only the
// tiles its rows' documents reach (counted: the hull of the block's visible keys), far
// fewer than causal attention's, and the results are right.
TEST(ScalarAttentionOnCpu, DocumentMaskSkipsTiles) {
  const int B = 1, T = 512, NH = 2, NKV = 1, hd = 32;
  const auto pos = test::positions(T);
  const auto p = test::random_problem<float>(B, T, T, NH, NKV, hd, pos, pos, test::random_documents(pos, B, 12, 5), 17,
                                             kElement<float>);
  const auto k = kernels<32, float>();
  auto x = test::operands_of(p, true, kElement<float>);
  attention_tiles = 0;
  k.forward(x);
  const long forward_tiles = attention_tiles.exchange(0);
  EXPECT_EQ(forward_tiles, NH * test::expected_key_tiles(p, kRows, kTile));
  test::AttentionProblem causal = p;
  causal.doc_start.clear();
  const long causal_tiles = NH * test::expected_key_tiles(causal, kRows, kTile);
  EXPECT_LT(3 * forward_tiles, causal_tiles) << "documents of <= 12 tokens: a block sees at most 75 keys";
  k.backward(x);
  const long backward_tiles = attention_tiles.exchange(0);
  EXPECT_EQ(backward_tiles, NH * (test::expected_key_tiles(p, kRows, kTile) + test::expected_query_tiles(p, kRows, kQueryTile)));
  EXPECT_LT(3 * backward_tiles,
            NH * (causal_tiles / NH + test::expected_query_tiles(causal, kRows, kQueryTile)));
  expect_close(test::compare_attention(test::reference_attention(p), test::results_of(x, kElement<float>), NKV, hd),
               kFp32, "documents <= 12, T 512");
}

// ---- blocks of another rank's keys (context parallelism) ------------------------------

// Queries at positions 100.. (a later rank's share), keys of another rank in a buffer of
// their own (kv_ld = 2 NKV hd) at positions 1, 4, 7, ...: some in the queries' past, some
// in their future; Tk != Tq.
template <int HD, typename E>
test::AttentionErrors other_rank(int B, int Tq, int Tk, int NH, int NKV, int hd, int max_len, int first_key = 1) {
  const auto q_pos = test::positions(Tq, 100);
  const auto p = test::random_problem<E>(B, Tq, Tk, NH, NKV, hd, q_pos, test::positions(Tk, first_key, 3),
                                         max_len > 0 ? documents(q_pos, B, max_len, 3) : std::vector<int32_t>{},
                                         11 + Tq + Tk + hd, kElement<E>);
  return test::run_case(p, false, kernels<HD, E>(), kElement<E>);
}

TEST(ScalarAttentionOnCpu, OtherRanksKeysShiftedPositions) {
  expect_close(other_rank<32, float>(2, 70, 45, 4, 2, 32, 0), kFp32, "other rank, Tq 70 Tk 45, NH 4 NKV 2, hd 32");
  expect_close(other_rank<64, float>(1, 40, 100, 2, 1, 64, 0), kFp32, "other rank, Tq 40 Tk 100, NH 2 NKV 1, hd 64");
}
TEST(ScalarAttentionOnCpu, OtherRanksKeysWithDocuments) {
  expect_close(other_rank<32, float>(2, 70, 45, 4, 2, 32, 30), kFp32, "other rank, documents <= 30");
  expect_close(other_rank<128, bf16>(1, 50, 70, 4, 1, 128, 40), kBf16, "bf16 other rank, documents <= 40, hd 128");
}
// Keys all in the causal future of every query: every row sees nothing (out 0, lse -inf,
// gradients 0, no NaN).
TEST(ScalarAttentionOnCpu, OtherRanksKeysAllInTheFuture) {
  expect_close(other_rank<32, float>(1, 70, 45, 4, 2, 32, 0, 500), kFp32, "keys in the future");
  expect_close(other_rank<64, bf16>(2, 30, 20, 2, 2, 64, 10, 500), kBf16, "bf16 keys in the future, documents");
}

// A rank's queries over its own keys and another rank's block, each block's forward
// alone, out and lse combined, each block's backward with the combined ones: together
// exactly attention over both blocks.
template <int HD, typename E>
test::AttentionErrors two_blocks(int B, int Tq, int Tk, int NH, int NKV, int hd, int max_len, int first_key) {
  const auto pos = test::positions(Tq, 200);
  const auto own = test::random_problem<E>(B, Tq, Tq, NH, NKV, hd, pos, pos,
                                           max_len > 0 ? documents(pos, B, max_len, 1) : std::vector<int32_t>{},
                                           5 + Tq + hd, kElement<E>);
  const auto other = test::other_block<E>(own, Tk, test::positions(Tk, first_key, 2), 6 + Tk, kElement<E>);
  return test::run_two_blocks(own, other, kernels<HD, E>(), kElement<E>);
}

TEST(ScalarAttentionOnCpu, TwoKeyBlocksCombined) {
  expect_close(two_blocks<32, float>(1, 70, 100, 4, 2, 32, 0, 1), kFp32, "own + earlier block");
  expect_close(two_blocks<32, float>(2, 70, 100, 4, 2, 32, 60, 101), kFp32, "own + overlapping block, documents");
  expect_close(two_blocks<64, bf16>(1, 50, 30, 2, 1, 64, 0, 400), kBf16, "bf16 own + future block");
}

}  // namespace scalar
}  // namespace trident::kernels::cuda_sim
