// The tensor-core flash-attention kernels (kernels/cuda/attention_tensor_core_kernels.cuh)
// run on the CPU, without a GPU: each block's 128 threads are std::threads with real
// block and warp barriers; WMMA is replaced by a stand-in that applies its layout rules
// and checks its alignment rules (32-byte pointers, ldm multiples, shared-memory bounds).
// Shared memory starts as NaN bytes and the outputs as NaN, so a value never written or a
// read of padding shows. Outputs are checked against a float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/bf16.h"

namespace trident::kernels::cuda_sim {

// ---- the CUDA names the kernels use ----
#define __global__
#define __device__
#define __launch_bounds__(threads)

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx, blockIdx;
Dim3 gridDim;

struct bf16 {
  uint16_t bits;
};
inline float to_float(bf16 b) { return bf16_bits_to_float(b.bits); }
inline bf16 __float2bfloat16_rn(float f) { return bf16{float_to_bf16_bits(f)}; }
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float logf(float x) { return std::log(x); }

// One block at a time: its shared memory and barriers.
struct Block {
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  std::barrier<>* all = nullptr;
  std::barrier<>* warp[4] = {};
  float shuffle[4][32] = {};
};
Block block;

inline void __syncthreads() { block.all->arrive_and_wait(); }
inline void __syncwarp() { block.warp[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  block.shuffle[w][lane] = v;
  __syncwarp();
  const float other = block.shuffle[w][lane ^ mask];
  __syncwarp();
  return other;
}

#define TRIDENT_DYNAMIC_SHARED(name) unsigned char* name = block.shared

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

#include "kernels/cuda/attention_tensor_core_kernels.cuh"

// Runs `kernel` on a (gx, gy) grid of 128-thread blocks, one block after the other.
template <typename Kernel>
void launch(unsigned gx, unsigned gy, size_t shared_bytes, Kernel kernel) {
  std::vector<unsigned char> memory(shared_bytes + 128);
  gridDim = {gx, gy, 1};
  for (unsigned by = 0; by < gy; by++)
    for (unsigned bx = 0; bx < gx; bx++) {
      block.shared = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(memory.data()) + 127) & ~uintptr_t(127));
      block.shared_bytes = shared_bytes;
      std::memset(block.shared, 0xff, shared_bytes);  // NaN
      std::barrier<> all(kThreads), w0(32), w1(32), w2(32), w3(32);
      block.all = &all;
      block.warp[0] = &w0, block.warp[1] = &w1, block.warp[2] = &w2, block.warp[3] = &w3;
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          try {
            kernel();
          } catch (const std::exception& e) {
            std::fprintf(stderr, "tensor-core attention on the CPU: thread %u: %s\n", t, e.what());
            std::abort();  // the other threads would wait at a barrier forever
          }
        });
      for (auto& t : threads) t.join();
    }
}

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;        // largest absolute errors
  double out_max = 0, dq_max = 0, dk_max = 0, dv_max = 0;  // largest reference values
  bool unwritten = false;
};

template <int HD>
Errors run_against_reference(int B, int T, int NH) {
  const int C = NH * HD;
  std::mt19937 rng(123 + T + HD);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bf16 nan{0x7fc0};
  std::vector<bf16> qkv(size_t(B) * T * 3 * C), dout(size_t(B) * T * C), out(size_t(B) * T * C, nan),
      dqkv(size_t(B) * T * 3 * C, nan);
  for (auto& x : qkv) x = __float2bfloat16_rn(1.5f * normal(rng));
  for (auto& x : dout) x = __float2bfloat16_rn(normal(rng));
  std::vector<float> lse(size_t(B) * NH * T, NAN), delta(size_t(B) * NH * T);
  const unsigned gx = (T + kRows - 1) / kRows, gy = B * NH;
  launch(gx, gy, forward_shared<HD>(), [&] { tc_forward_kernel<HD>(out.data(), lse.data(), qkv.data(), T, C, NH); });
  for (int b = 0; b < B; b++)  // delta = dO . O per row, as row_dot_kernel makes it
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        double d = 0;
        for (int k = 0; k < HD; k++)
          d += double(to_float(dout[(size_t(b) * T + i) * C + h * HD + k])) * to_float(out[(size_t(b) * T + i) * C + h * HD + k]);
        delta[size_t(b * NH + h) * T + i] = static_cast<float>(d);
      }
  launch(gx, gy, backward_kv_shared<HD>(),
         [&] { tc_backward_kv_kernel<HD>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, C, NH); });
  launch(gx, gy, backward_q_shared<HD>(),
         [&] { tc_backward_q_kernel<HD>(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), T, C, NH); });

  Errors e;
  const double scale = 1.0 / std::sqrt(double(HD));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const auto at = [&](int part, int i, int d) { return (size_t(b) * T + i) * 3 * C + part * C + h * HD + d; };
      const auto q = [&](int i, int d) { return double(to_float(qkv[at(0, i, d)])); };
      const auto k = [&](int i, int d) { return double(to_float(qkv[at(1, i, d)])); };
      const auto v = [&](int i, int d) { return double(to_float(qkv[at(2, i, d)])); };
      const auto dO = [&](int i, int d) { return double(to_float(dout[(size_t(b) * T + i) * C + h * HD + d])); };
      std::vector<double> P(size_t(T) * T, 0.0), dS(size_t(T) * T, 0.0);
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
        e.lse = std::max(e.lse, std::abs(m + std::log(l) - lse[size_t(b * NH + h) * T + i]));
        double row_term = 0;
        std::vector<double> dP(i + 1);
        for (int j = 0; j <= i; j++) {
          for (int d = 0; d < HD; d++) dP[j] += dO(i, d) * v(j, d);
          row_term += P[size_t(i) * T + j] * dP[j];
        }
        for (int j = 0; j <= i; j++) dS[size_t(i) * T + j] = P[size_t(i) * T + j] * (dP[j] - row_term) * scale;
        for (int d = 0; d < HD; d++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += P[size_t(i) * T + j] * v(j, d);
          const double got = to_float(out[(size_t(b) * T + i) * C + h * HD + d]);
          e.unwritten |= std::isnan(got);
          e.out = std::max(e.out, std::abs(o - got));
          e.out_max = std::max(e.out_max, std::abs(o));
        }
      }
      for (int i = 0; i < T; i++)
        for (int d = 0; d < HD; d++) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j <= i; j++) dq += dS[size_t(i) * T + j] * k(j, d);
          for (int r = i; r < T; r++) {
            dk += dS[size_t(r) * T + i] * q(r, d);
            dv += P[size_t(r) * T + i] * dO(r, d);
          }
          const double gq = to_float(dqkv[at(0, i, d)]), gk = to_float(dqkv[at(1, i, d)]), gv = to_float(dqkv[at(2, i, d)]);
          e.unwritten |= std::isnan(gq) || std::isnan(gk) || std::isnan(gv);
          e.dq = std::max(e.dq, std::abs(dq - gq));
          e.dk = std::max(e.dk, std::abs(dk - gk));
          e.dv = std::max(e.dv, std::abs(dv - gv));
          e.dq_max = std::max(e.dq_max, std::abs(dq));
          e.dk_max = std::max(e.dk_max, std::abs(dk));
          e.dv_max = std::max(e.dv_max, std::abs(dv));
        }
    }
  return e;
}

// bf16 inputs and outputs: errors of a few bf16 roundings of the largest values.
void expect_close(const Errors& e, const std::string& what) {
  EXPECT_FALSE(e.unwritten) << what << ": an output was never written";
  EXPECT_LT(e.out, 0.02 * std::max(1.0, e.out_max)) << what;
  EXPECT_LT(e.lse, 1e-3) << what;
  EXPECT_LT(e.dq, 0.03 * std::max(1.0, e.dq_max)) << what;
  EXPECT_LT(e.dk, 0.03 * std::max(1.0, e.dk_max)) << what;
  EXPECT_LT(e.dv, 0.03 * std::max(1.0, e.dv_max)) << what;
}

TEST(TensorCoreAttentionOnCpu, HeadDim32TwoSequencesPartialTile) { expect_close(run_against_reference<32>(2, 130, 2), "hd 32, T 130"); }
TEST(TensorCoreAttentionOnCpu, HeadDim64) { expect_close(run_against_reference<64>(1, 130, 2), "hd 64, T 130"); }
TEST(TensorCoreAttentionOnCpu, HeadDim128) { expect_close(run_against_reference<128>(1, 130, 1), "hd 128, T 130"); }
TEST(TensorCoreAttentionOnCpu, OneFullTileAndASingleToken) {
  expect_close(run_against_reference<32>(1, 64, 3), "hd 32, T 64");
  expect_close(run_against_reference<64>(1, 1, 2), "hd 64, T 1");
}

}  // namespace trident::kernels::cuda_sim
