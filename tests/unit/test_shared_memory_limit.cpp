// kernels/cuda/shared_memory_limit.h without CUDA: the tensor-core attention raises each
// kernel's dynamic shared-memory limit through it. Stand-in kernels share one signature,
// as the attention kernels of all head dimensions (and backward kv and q) do, so a limit
// kept per function-pointer type rather than per kernel fails here.
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/shared_memory_limit.h"

namespace trident::kernels::cuda {
namespace {

// Distinct bodies: identical-code folding cannot give two of them one address.
int sink = 0;
template <int HD>
void forward_kernel(int* out, int n) { sink = *out + n * HD; }
template <int HD>
void backward_kv_kernel(int* out, int n) { sink = *out - n * HD; }
template <int HD>
void backward_q_kernel(int* out, int n) { sink = *out ^ (n * HD); }

using Kernel = void (*)(int*, int);

// Every setter call: the kernel and the bytes.
struct Calls {
  std::vector<std::pair<Kernel, size_t>> calls;
  void allow(SharedMemoryLimits& limits, Kernel kernel, size_t bytes) {
    limits.allow(kernel, bytes, [&](size_t n) { calls.emplace_back(kernel, n); });
  }
};

TEST(SharedMemoryLimit, DistinctKernelsOfOneSignatureEachGetTheAttribute) {
  SharedMemoryLimits limits;
  Calls c;
  const std::vector<std::pair<Kernel, size_t>> kernels = {
      {forward_kernel<32>, 50'000},      {forward_kernel<64>, 70'000},      {forward_kernel<128>, 120'000},
      {backward_kv_kernel<64>, 90'000},  {backward_q_kernel<64>, 90'000},   {backward_kv_kernel<128>, 160'000},
      {backward_q_kernel<128>, 150'000}};
  for (const auto& [kernel, bytes] : kernels) c.allow(limits, kernel, bytes);
  EXPECT_EQ(c.calls, kernels);
}

TEST(SharedMemoryLimit, SameKernelAndBytesSetOnce) {
  SharedMemoryLimits limits;
  Calls c;
  for (int i = 0; i < 3; i++) c.allow(limits, forward_kernel<64>, 70'000);
  c.allow(limits, forward_kernel<64>, 60'000);  // less than allowed: nothing to do
  EXPECT_EQ(c.calls, (std::vector<std::pair<Kernel, size_t>>{{forward_kernel<64>, 70'000}}));
}

TEST(SharedMemoryLimit, MoreBytesSetAgain) {
  SharedMemoryLimits limits;
  Calls c;
  c.allow(limits, backward_q_kernel<32>, 50'000);
  c.allow(limits, backward_q_kernel<32>, 80'000);
  c.allow(limits, backward_q_kernel<32>, 80'000);
  c.allow(limits, backward_q_kernel<32>, 60'000);
  EXPECT_EQ(c.calls, (std::vector<std::pair<Kernel, size_t>>{{backward_q_kernel<32>, 50'000},
                                                            {backward_q_kernel<32>, 80'000}}));
}

TEST(SharedMemoryLimit, AFailedSetIsTriedAgain) {
  SharedMemoryLimits limits;
  EXPECT_THROW(limits.allow(forward_kernel<32>, 50'000, [](size_t) { throw std::runtime_error("invalid value"); }),
               std::runtime_error);
  Calls c;
  c.allow(limits, forward_kernel<32>, 50'000);
  EXPECT_EQ(c.calls.size(), 1u);
}

TEST(SharedMemoryLimit, ConcurrentCallersSetOnce) {
  SharedMemoryLimits limits;
  int sets = 0;  // guarded by the limits' mutex: set runs under it
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; t++)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; i++) limits.allow(forward_kernel<128>, 120'000, [&](size_t) { sets++; });
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(sets, 1);
}

}  // namespace
}  // namespace trident::kernels::cuda
