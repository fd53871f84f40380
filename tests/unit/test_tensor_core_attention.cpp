// The tensor-core flash-attention kernels (kernels/cuda/attention_tensor_core_kernels.cuh)
// run on the CPU, without a GPU (tests/unit/cuda_simulator.h: each block's 128 threads
// are std::threads with real block and warp barriers); WMMA is replaced by a stand-in
// that applies its layout rules and checks its alignment rules (32-byte pointers, ldm
// multiples, shared-memory bounds). Shared memory starts as NaN bytes and the outputs as
// NaN, so a value never written or a read of padding shows. Outputs are checked against
// a float64 reference (tests/unit/attention_reference.h), grouped-query attention
// included: dK and dV of a key/value head summed over the query heads of its group.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>

#include "tests/unit/attention_reference.h"
#include "tests/unit/cuda_simulator.h"

namespace trident::kernels::cuda_sim {

void require_fragment_access(const void* p, unsigned ldm, size_t element_bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(block.shared);
  if (at < base || at + (15 * ldm + 16) * element_bytes > base + block.shared_bytes)
    throw std::logic_error("WMMA access outside shared memory");
  if ((at - base) % 32 != 0) throw std::logic_error("WMMA pointer not 32-byte aligned");
  if (ldm % (element_bytes == 2 ? 8 : 4) != 0) throw std::logic_error("WMMA ldm not a multiple of 16 bytes");
}

// WMMA with 16 x 16 x 16 tiles: every lane holds the whole tile (the layout inside a
// fragment is opaque to the kernels, so any works); loads and stores synchronize the warp
// as the real ones do.
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float x[256];
};
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const bf16* p, unsigned ldm) {
  require_fragment_access(p, ldm, 2);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      f.x[i * 16 + j] = to_float(std::is_same_v<Layout, row_major> ? p[i * ldm + j] : p[j * ldm + i]);
  __syncwarp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t) {
  require_fragment_access(p, ldm, 4);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) f.x[i * 16 + j] = p[i * ldm + j];
  __syncwarp();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t) {
  require_fragment_access(p, ldm, 4);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int e = lane * 8; e < lane * 8 + 8; e++) p[(e / 16) * ldm + e % 16] = f.x[e];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) { std::fill(f.x, f.x + 256, v); }
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, bf16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, bf16, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float t[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; k++) s += a.x[i * 16 + k] * b.x[k * 16 + j];
      t[i * 16 + j] = s;
    }
  std::copy(t, t + 256, d.x);
}
}  // namespace nvcuda::wmma

namespace tensor_core {

#include "kernels/cuda/attention_tensor_core_kernels.cuh"

template <typename E>
const test::ElementType<E> kElement{[](float x) { return __float2bfloat16_rn(x); }, [](E x) { return to_float(x); }};

unsigned blocks(int rows) { return static_cast<unsigned>((rows + kRows - 1) / kRows); }

// The launches of attention_tensor_core.cu; delta = dO . O per row, as row_dot_kernel
// makes it (in float64 here).
template <int HD>
test::AttentionKernels<bf16> kernels() {
  return {[](test::AttentionOperands<bf16>& x) {
            const AttentionDims dims{x.Tq, x.Tk, x.NH, x.NKV, HD, x.kv_ld};
            launch(blocks(x.Tq), x.B * x.NH, kThreads, forward_shared<HD>(), [&] {
              tc_forward_kernel<HD>(x.out.data(), x.lse.data(), x.qkv.data(), x.kv(), x.mask(), dims);
            });
          },
          [](test::AttentionOperands<bf16>& x) {
            const AttentionDims dims{x.Tq, x.Tk, x.NH, x.NKV, HD, x.kv_ld};
            const size_t O = size_t(x.NH) * HD;
            for (int b = 0; b < x.B; b++)
              for (int h = 0; h < x.NH; h++)
                for (int i = 0; i < x.Tq; i++) {
                  double d = 0;
                  for (int k = 0; k < HD; k++) {
                    const size_t at = (size_t(b) * x.Tq + i) * O + h * HD + k;
                    d += double(to_float(x.dout[at])) * to_float(x.out[at]);
                  }
                  x.delta[size_t(b * x.NH + h) * x.Tq + i] = static_cast<float>(d);
                }
            launch(blocks(x.Tk), x.B * x.NKV, kThreads, backward_kv_shared<HD>(), [&] {
              tc_backward_kv_kernel<HD>(x.dkv(), x.dout.data(), x.qkv.data(), x.kv(), x.lse.data(), x.delta.data(),
                                        x.mask(), dims);
            });
            launch(blocks(x.Tq), x.B * x.NH, kThreads, backward_q_shared<HD>(), [&] {
              tc_backward_q_kernel<HD>(x.dqkv.data(), x.dout.data(), x.qkv.data(), x.kv(), x.lse.data(),
                                       x.delta.data(), x.mask(), dims);
            });
          }};
}

// B sequences of T tokens at positions 0..T-1 attending causally to their own keys, NH
// query heads over NKV key/value heads of dimension HD, bf16 inputs.
template <int HD>
test::AttentionErrors run_against_reference(int B, int T, int NH, int NKV) {
  const auto p = test::random_problem<bf16>(B, T, T, NH, NKV, HD, test::positions(T), test::positions(T), {},
                                            123 + T + HD + 7 * NKV, kElement<bf16>);
  return test::run_case(p, true, kernels<HD>(), kElement<bf16>);
}

// bf16 inputs and outputs: errors of a few bf16 roundings of the largest values.
void expect_close(const test::AttentionErrors& e, const std::string& what) {
  for (const test::PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv})
    EXPECT_FALSE(part->unwritten) << what << ": an output was never written (or is NaN): part " << (part - &e.out);
  EXPECT_LT(e.out.error, 0.02 * std::max(1.0, e.out.largest)) << what;
  EXPECT_LT(e.lse.error, 1e-3) << what;
  EXPECT_LT(e.dq.error, 0.03 * std::max(1.0, e.dq.largest)) << what;
  EXPECT_LT(e.dk.error, 0.03 * std::max(1.0, e.dk.largest)) << what;
  EXPECT_LT(e.dv.error, 0.03 * std::max(1.0, e.dv.largest)) << what;
}

TEST(TensorCoreAttentionOnCpu, HeadDim32TwoSequencesPartialTile) { expect_close(run_against_reference<32>(2, 130, 2, 2), "hd 32, T 130"); }
TEST(TensorCoreAttentionOnCpu, HeadDim64) { expect_close(run_against_reference<64>(1, 130, 2, 2), "hd 64, T 130"); }
TEST(TensorCoreAttentionOnCpu, HeadDim128) { expect_close(run_against_reference<128>(1, 130, 1, 1), "hd 128, T 130"); }
TEST(TensorCoreAttentionOnCpu, OneFullTileAndASingleToken) {
  expect_close(run_against_reference<32>(1, 64, 3, 3), "hd 32, T 64");
  expect_close(run_against_reference<64>(1, 1, 2, 2), "hd 64, T 1");
}
// Grouped-query attention: query head h reads key/value head h / (NH / NKV), and the
// dK/dV kernel sums the group's query heads.
TEST(TensorCoreAttentionOnCpu, GroupedQueryTwoKeyValueHeads) {
  expect_close(run_against_reference<32>(2, 130, 4, 2), "GQA NH 4 NKV 2, hd 32, T 130");
  expect_close(run_against_reference<64>(1, 64, 6, 2), "GQA NH 6 NKV 2 (groups of 3), hd 64, T 64");
  expect_close(run_against_reference<64>(1, 1, 4, 2), "GQA NH 4 NKV 2, hd 64, T 1");
}
TEST(TensorCoreAttentionOnCpu, MultiQueryOneKeyValueHead) {
  expect_close(run_against_reference<64>(1, 130, 4, 1), "MQA NH 4 NKV 1, hd 64, T 130");
  expect_close(run_against_reference<32>(1, 1, 4, 1), "MQA NH 4 NKV 1, hd 32, T 1");
}
TEST(TensorCoreAttentionOnCpu, GroupedQueryHeadDim128) {
  expect_close(run_against_reference<128>(1, 130, 3, 1), "GQA NH 3 NKV 1, hd 128, T 130");
}

// ---- document masking ----------------------------------------------------------------

// Sequence 0: random documents of 1..max_len tokens; sequence 1 (if any): one document
// over the whole sequence.
std::vector<int32_t> documents(const std::vector<int32_t>& pos, int B, int max_len, uint32_t seed) {
  std::vector<int32_t> starts = test::random_documents(pos, 1, max_len, seed);
  for (int b = 1; b < B; b++) starts.insert(starts.end(), pos.size(), pos.front());
  return starts;
}

template <int HD>
test::AttentionErrors packed(int B, int T, int NH, int NKV, int max_len) {
  const auto pos = test::positions(T);
  const auto p = test::random_problem<bf16>(B, T, T, NH, NKV, HD, pos, pos, documents(pos, B, max_len, 7 + T),
                                            99 + T + HD, kElement<bf16>);
  return test::run_case(p, true, kernels<HD>(), kElement<bf16>);
}

// Documents of 1..20 tokens (shorter than a tile and than a warp's 16 rows) in sequence
// 0, one document over the whole sequence in sequence 1; grouped-query heads.
TEST(TensorCoreAttentionOnCpu, DocumentMaskShortDocumentsAndOneWholeSequence) {
  expect_close(packed<32>(2, 150, 4, 2, 20), "documents <= 20, NH 4 NKV 2, hd 32, T 150");
  expect_close(packed<64>(1, 130, 2, 1, 100), "documents <= 100, NH 2 NKV 1, hd 64, T 130");
  expect_close(packed<128>(1, 70, 2, 1, 10), "documents <= 10, NH 2 NKV 1, hd 128, T 70");
}

// Documents far shorter than a tile: every block loads only the tiles its rows'
// documents reach (counted), far fewer than causal attention's; warps skip the tiles
// their own 16 rows do not see; the results are right.
TEST(TensorCoreAttentionOnCpu, DocumentMaskSkipsTiles) {
  const int B = 1, T = 640, NH = 2, NKV = 1;
  const auto pos = test::positions(T);
  const auto p = test::random_problem<bf16>(B, T, T, NH, NKV, 32, pos, pos, test::random_documents(pos, B, 12, 5), 17,
                                            kElement<bf16>);
  const auto k = kernels<32>();
  auto x = test::operands_of(p, true, kElement<bf16>);
  attention_tiles = 0;
  attention_warp_tiles = 0;
  k.forward(x);
  const long forward_tiles = attention_tiles.exchange(0), forward_warp_tiles = attention_warp_tiles.exchange(0);
  const long want = NH * test::expected_key_tiles(p, kRows, kRows);
  EXPECT_EQ(forward_tiles, want);
  test::AttentionProblem causal = p;
  causal.doc_start.clear();
  EXPECT_LT(2 * forward_tiles, NH * test::expected_key_tiles(causal, kRows, kRows))
      << "documents of <= 12 tokens: a block sees at most 75 keys";
  EXPECT_LT(forward_warp_tiles, kWarps * forward_tiles) << "no warp skipped a tile its rows do not see";
  k.backward(x);
  EXPECT_EQ(attention_tiles.exchange(0),
            NH * (test::expected_key_tiles(p, kRows, kRows) + test::expected_query_tiles(p, kRows, kRows)));
  expect_close(test::compare_attention(test::reference_attention(p), test::results_of(x, kElement<bf16>), NKV, 32),
               "documents <= 12, T 640");
}

// ---- blocks of another rank's keys (context parallelism) ------------------------------

// Queries at positions 100.. (a later rank's share), keys of another rank in a buffer of
// their own (kv_ld = 2 NKV HD) at positions first_key, +3, +6, ...; Tk != Tq.
template <int HD>
test::AttentionErrors other_rank(int B, int Tq, int Tk, int NH, int NKV, int max_len, int first_key = 1) {
  const auto q_pos = test::positions(Tq, 100);
  const auto p = test::random_problem<bf16>(B, Tq, Tk, NH, NKV, HD, q_pos, test::positions(Tk, first_key, 3),
                                            max_len > 0 ? documents(q_pos, B, max_len, 3) : std::vector<int32_t>{},
                                            11 + Tq + Tk + HD, kElement<bf16>);
  return test::run_case(p, false, kernels<HD>(), kElement<bf16>);
}

TEST(TensorCoreAttentionOnCpu, OtherRanksKeysShiftedPositions) {
  expect_close(other_rank<32>(2, 70, 45, 4, 2, 0), "other rank, Tq 70 Tk 45, NH 4 NKV 2, hd 32");
  expect_close(other_rank<64>(1, 40, 130, 2, 1, 0), "other rank, Tq 40 Tk 130, NH 2 NKV 1, hd 64");
}
TEST(TensorCoreAttentionOnCpu, OtherRanksKeysWithDocuments) {
  expect_close(other_rank<32>(2, 70, 45, 4, 2, 30), "other rank, documents <= 30");
  expect_close(other_rank<128>(1, 50, 70, 2, 1, 40), "other rank, documents <= 40, hd 128");
}
// Keys all in the causal future of every query: out 0, lse -inf, gradients 0, no NaN.
TEST(TensorCoreAttentionOnCpu, OtherRanksKeysAllInTheFuture) {
  expect_close(other_rank<32>(1, 70, 45, 4, 2, 0, 500), "keys in the future");
  expect_close(other_rank<64>(2, 30, 20, 2, 2, 10, 500), "keys in the future, documents");
}

// A rank's queries over its own keys and another rank's block, each block's forward
// alone, out and lse combined, each block's backward with the combined ones: together
// exactly attention over both blocks.
template <int HD>
test::AttentionErrors two_blocks(int B, int Tq, int Tk, int NH, int NKV, int max_len, int first_key) {
  const auto pos = test::positions(Tq, 200);
  const auto own = test::random_problem<bf16>(B, Tq, Tq, NH, NKV, HD, pos, pos,
                                              max_len > 0 ? documents(pos, B, max_len, 1) : std::vector<int32_t>{},
                                              5 + Tq + HD, kElement<bf16>);
  const auto other = test::other_block<bf16>(own, Tk, test::positions(Tk, first_key, 2), 6 + Tk, kElement<bf16>);
  return test::run_two_blocks(own, other, kernels<HD>(), kElement<bf16>);
}

TEST(TensorCoreAttentionOnCpu, TwoKeyBlocksCombined) {
  expect_close(two_blocks<32>(1, 70, 100, 4, 2, 0, 1), "own + earlier block");
  expect_close(two_blocks<32>(2, 70, 100, 4, 2, 60, 101), "own + overlapping block, documents");
  expect_close(two_blocks<64>(1, 50, 30, 2, 1, 0, 400), "own + future block");
}

}  // namespace tensor_core
}  // namespace trident::kernels::cuda_sim
