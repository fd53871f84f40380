// The scalar flash-attention kernels (kernels/cuda/attention_scalar_kernels.cuh: the CUDA
// path of fp32, and of head dimensions the tensor cores do not take) run on the CPU,
// without a GPU (tests/unit/cuda_simulator.h), against the float64 reference
// (tests/unit/attention_reference.h), grouped-query attention included. Shared memory
// starts as NaN bytes and the outputs as NaN, so a value never written shows.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/unit/attention_reference.h"
#include "tests/unit/cuda_simulator.h"

namespace trident::kernels::cuda_sim {
namespace scalar {

#include "kernels/cuda/attention_scalar_kernels.cuh"

// B sequences of T tokens, NH query heads over NKV key/value heads of dimension hd <=
// HD (the kernels' register capacity), in element type E (float or bf16): the four
// kernels (forward, row_dot, dK/dV, dQ) on the CPU.
template <int HD, typename E>
test::AttentionErrors run_against_reference(int B, int T, int NH, int NKV, int hd) {
  const size_t W = size_t(NH + 2 * NKV) * hd, O = size_t(NH) * hd;
  std::mt19937 rng(321 + T + hd + 5 * NKV);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const E nan = from_float<E>(NAN);
  std::vector<E> qkv(size_t(B) * T * W), dout(size_t(B) * T * O), out(size_t(B) * T * O, nan),
      dqkv(size_t(B) * T * W, nan);
  for (auto& x : qkv) x = from_float<E>(1.5f * normal(rng));
  for (auto& x : dout) x = from_float<E>(normal(rng));
  std::vector<float> lse(size_t(B) * NH * T, NAN), delta(size_t(B) * NH * T, NAN);
  // The launches of attention.cu: kThreads<HD> threads (kRows rows) a block.
  const unsigned gx = (T + kRows - 1) / kRows;
  launch(gx, B * NH, kThreads<HD>, scalar_forward_shared<HD>(),
         [&] { flash_forward_kernel<HD, E>(out.data(), lse.data(), qkv.data(), T, NH, NKV, hd); });
  const unsigned row_blocks = (B * NH * T + 255) / 256;
  launch(row_blocks, 1, 256, 0, [&] { row_dot_kernel<E>(delta.data(), dout.data(), out.data(), B, T, NH, hd); });
  launch(gx, B * NKV, kThreads<HD>, scalar_backward_kv_shared<HD>(), [&] {
    flash_backward_kv_kernel<HD, E>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, NH, NKV, hd);
  });
  launch(gx, B * NH, kThreads<HD>, scalar_backward_q_shared<HD>(), [&] {
    flash_backward_q_kernel<HD, E>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, NH, NKV, hd);
  });
  const auto wide = [](const auto& v) {
    std::vector<double> w(v.size());
    for (size_t i = 0; i < v.size(); i++) w[i] = to_float(v[i]);
    return w;
  };
  const test::AttentionReference want = test::reference_attention(wide(qkv), wide(dout), B, T, NH, NKV, hd);
  return test::compare_attention(want, wide(out), wide(lse), wide(dqkv), B, T, NH, NKV, hd);
}

// tolerance: relative to the largest reference value of each output (at least 1).
void expect_close(const test::AttentionErrors& e, double tolerance, const std::string& what) {
  for (const test::PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv})
    EXPECT_FALSE(part->unwritten) << what << ": an output was never written";
  EXPECT_LT(e.out.error, tolerance * std::max(1.0, e.out.largest)) << what;
  EXPECT_LT(e.lse.error, 1e-3) << what;
  EXPECT_LT(e.dq.error, tolerance * std::max(1.0, e.dq.largest)) << what;
  EXPECT_LT(e.dk.error, tolerance * std::max(1.0, e.dk.largest)) << what;
  EXPECT_LT(e.dv.error, tolerance * std::max(1.0, e.dv.largest)) << what;
}

constexpr double kFp32 = 1e-4, kBf16 = 0.03;

TEST(ScalarAttentionOnCpu, MultiHeadHeadDim32TwoSequencesPartialTile) {
  expect_close(run_against_reference<32, float>(2, 130, 2, 2, 32), kFp32, "NH 2 NKV 2, hd 32, T 130");
}
TEST(ScalarAttentionOnCpu, GroupedQueryHeadDim64) {
  expect_close(run_against_reference<64, float>(1, 130, 4, 2, 64), kFp32, "NH 4 NKV 2, hd 64, T 130");
  expect_close(run_against_reference<64, float>(1, 1, 4, 2, 64), kFp32, "NH 4 NKV 2, hd 64, T 1");
}
TEST(ScalarAttentionOnCpu, MultiQueryHeadDim48InRegistersOf64) {
  expect_close(run_against_reference<64, float>(2, 70, 4, 1, 48), kFp32, "NH 4 NKV 1, hd 48, T 70");
}
TEST(ScalarAttentionOnCpu, GroupedQueryHeadDim128) {
  expect_close(run_against_reference<128, float>(1, 64, 6, 2, 128), kFp32, "NH 6 NKV 2, hd 128, T 64");
}
TEST(ScalarAttentionOnCpu, GroupedQueryBf16) {
  expect_close(run_against_reference<32, bf16>(1, 100, 4, 2, 32), kBf16, "bf16 NH 4 NKV 2, hd 32, T 100");
  expect_close(run_against_reference<32, bf16>(1, 100, 4, 1, 24), kBf16, "bf16 NH 4 NKV 1, hd 24, T 100");
}

// Head dimension 128 (Llama's): a row over 4 lanes of a warp. T 70: the second block of
// rows has 6, so one warp has rows past the sequence and seven have none.
TEST(ScalarAttentionOnCpu, MultiQueryHeadDim128TwoSequencesPartialBlock) {
  expect_close(run_against_reference<128, float>(2, 70, 4, 1, 128), kFp32, "NH 4 NKV 1, hd 128, B 2, T 70");
}
TEST(ScalarAttentionOnCpu, GroupsOfFourHeadDim96InRegistersOf128) {
  expect_close(run_against_reference<128, float>(1, 70, 8, 2, 96), kFp32, "NH 8 NKV 2, hd 96, T 70");
}
TEST(ScalarAttentionOnCpu, HeadDim128Bf16) {
  expect_close(run_against_reference<128, bf16>(1, 45, 4, 1, 128), kBf16, "bf16 NH 4 NKV 1, hd 128, T 45");
  expect_close(run_against_reference<128, bf16>(1, 45, 8, 2, 96), kBf16, "bf16 NH 8 NKV 2, hd 96, T 45");
}

}  // namespace scalar
}  // namespace trident::kernels::cuda_sim
