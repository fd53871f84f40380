// Runs CUDA kernel source on the CPU, without a GPU, for the tests of kernels kept in
// headers (kernels/cuda/attention_*_kernels.cuh): each block's threads are std::threads
// with real block and warp barriers, one block after the other; shared memory starts as
// NaN bytes, so a value read before it was written shows. Provides the CUDA names those
// kernels use (threadIdx, __syncthreads, __shfl_xor_sync, bf16, float4, __expf, ...). The
// includer includes a kernel header inside a namespace nested in this one. Counts the
// attention kernels' tiles (attention_tiles, attention_warp_tiles).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/bf16.h"

#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(threads)

namespace trident::kernels::cuda_sim {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 gridDim, blockDim;

struct bf16 {
  uint16_t bits;
};
inline float to_float(bf16 b) { return bf16_bits_to_float(b.bits); }
inline float to_float(float x) { return x; }
inline bf16 __float2bfloat16_rn(float f) { return bf16{float_to_bf16_bits(f)}; }
template <typename T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return __float2bfloat16_rn(x);
}
struct uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float logf(float x) { return std::log(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

constexpr int kMaxWarps = 32;

// The block running now: its shared memory and barriers.
struct Block {
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  std::barrier<>* all = nullptr;
  std::barrier<>* warp[kMaxWarps] = {};
  float shuffle[2][kMaxWarps][32] = {};  // used in turn, see __shfl_xor_sync
};
inline Block block;
inline thread_local unsigned shuffle_turn = 0;  // this thread's shuffles so far

inline void __syncthreads() { block.all->arrive_and_wait(); }
inline void __syncwarp() { block.warp[threadIdx.x / 32]->arrive_and_wait(); }
// Every lane of the warp takes part (full mask, as the kernels use it). One barrier: a
// lane writes a buffer again two shuffles later, when every lane has passed the barrier
// of the shuffle in between, so has read it.
inline float __shfl_xor_sync(unsigned lanes, float v, int mask) {
  if (lanes != 0xffffffffu) throw std::logic_error("__shfl_xor_sync: the simulator runs whole warps only");
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  float(&buffer)[kMaxWarps][32] = block.shuffle[shuffle_turn++ % 2];
  buffer[w][lane] = v;
  __syncwarp();
  return buffer[w][lane ^ mask];
}
// An int's bits through the same buffer (the MoE router's argmax shuffles expert indices).
inline int __shfl_xor_sync(unsigned lanes, int v, int mask) {
  return std::bit_cast<int>(__shfl_xor_sync(lanes, std::bit_cast<float>(v), mask));
}

// The attention kernels' work counters (kernels/cuda/attention_visible.cuh): tiles a
// block loaded, and tiles a warp computed on.
inline std::atomic<long> attention_tiles{0}, attention_warp_tiles{0};
#define TRIDENT_ATTENTION_COUNT_TILE() ::trident::kernels::cuda_sim::attention_tiles++
#define TRIDENT_ATTENTION_COUNT_WARP_TILE() ::trident::kernels::cuda_sim::attention_warp_tiles++

// Dynamic shared memory is the block's bytes; a kernel's one static array too (launch
// it with that many bytes).
#define TRIDENT_DYNAMIC_SHARED(name) unsigned char* name = ::trident::kernels::cuda_sim::block.shared
#define TRIDENT_STATIC_SHARED(type, name, count) \
  type* name = reinterpret_cast<type*>(::trident::kernels::cuda_sim::block.shared)

// Runs `kernel` on a (gx, gy) grid of blocks of `threads` threads (a multiple of 32).
template <typename Kernel>
void launch(unsigned gx, unsigned gy, unsigned threads, size_t shared_bytes, Kernel kernel) {
  std::vector<unsigned char> memory(shared_bytes + 128);
  gridDim = {gx, gy, 1};
  blockDim = {threads, 1, 1};
  const unsigned warps = threads / 32;
  for (unsigned by = 0; by < gy; by++)
    for (unsigned bx = 0; bx < gx; bx++) {
      block.shared = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(memory.data()) + 127) & ~uintptr_t(127));
      block.shared_bytes = shared_bytes;
      std::memset(block.shared, 0xff, shared_bytes);  // NaN
      std::barrier<> all(threads);
      std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
      for (unsigned w = 0; w < warps; w++) {
        warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        block.warp[w] = warp_barriers.back().get();
      }
      block.all = &all;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; t++)
        pool.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          try {
            kernel();
          } catch (const std::exception& e) {
            std::fprintf(stderr, "CUDA kernel on the CPU: thread %u: %s\n", t, e.what());
            std::abort();  // the other threads would wait at a barrier forever
          }
        });
      for (auto& t : pool) t.join();
    }
}

}  // namespace trident::kernels::cuda_sim
