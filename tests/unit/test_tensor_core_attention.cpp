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

// B sequences of T tokens, NH query heads over NKV key/value heads of dimension HD: the
// three kernels on the CPU (delta = dO . O per row, as row_dot_kernel makes it) against
// the float64 reference on the same bf16 inputs.
template <int HD>
test::AttentionErrors run_against_reference(int B, int T, int NH, int NKV) {
  const size_t W = size_t(NH + 2 * NKV) * HD, O = size_t(NH) * HD;
  std::mt19937 rng(123 + T + HD + 7 * NKV);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bf16 nan{0x7fc0};
  std::vector<bf16> qkv(size_t(B) * T * W), dout(size_t(B) * T * O), out(size_t(B) * T * O, nan),
      dqkv(size_t(B) * T * W, nan);
  for (auto& x : qkv) x = __float2bfloat16_rn(1.5f * normal(rng));
  for (auto& x : dout) x = __float2bfloat16_rn(normal(rng));
  std::vector<float> lse(size_t(B) * NH * T, NAN), delta(size_t(B) * NH * T);
  const unsigned gx = (T + kRows - 1) / kRows;
  launch(gx, B * NH, kThreads, forward_shared<HD>(),
         [&] { tc_forward_kernel<HD>(out.data(), lse.data(), qkv.data(), T, NH, NKV); });
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        double d = 0;
        for (int k = 0; k < HD; k++) {
          const size_t at = (size_t(b) * T + i) * O + h * HD + k;
          d += double(to_float(dout[at])) * to_float(out[at]);
        }
        delta[size_t(b * NH + h) * T + i] = static_cast<float>(d);
      }
  launch(gx, B * NKV, kThreads, backward_kv_shared<HD>(), [&] {
    tc_backward_kv_kernel<HD>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, NH, NKV);
  });
  launch(gx, B * NH, kThreads, backward_q_shared<HD>(), [&] {
    tc_backward_q_kernel<HD>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, NH, NKV);
  });
  const auto wide = [](const auto& v) {
    std::vector<double> w(v.size());
    for (size_t i = 0; i < v.size(); i++) w[i] = to_float(v[i]);
    return w;
  };
  const test::AttentionReference want = test::reference_attention(wide(qkv), wide(dout), B, T, NH, NKV, HD);
  return test::compare_attention(want, wide(out), wide(lse), wide(dqkv), B, T, NH, NKV, HD);
}

// bf16 inputs and outputs: errors of a few bf16 roundings of the largest values.
void expect_close(const test::AttentionErrors& e, const std::string& what) {
  for (const test::PartError* part : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv})
    EXPECT_FALSE(part->unwritten) << what << ": an output was never written";
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

}  // namespace tensor_core
}  // namespace trident::kernels::cuda_sim
