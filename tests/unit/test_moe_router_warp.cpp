// The CUDA MoE router kernels (kernels/cuda/moe_router_kernels.cuh: a warp per token) on
// CPU threads (tests/unit/cuda_simulator.h), against the CPU kernels (kernels/cpu/moe.cpp):
// the same experts chosen in the same order, ties to the lowest index included; the
// weights, probabilities, lse and logit gradients within float rounding (the warp sums
// in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/moe_router.h"
#include "tests/unit/cuda_simulator.h"

namespace trident::kernels::cuda_sim {
namespace router {

#include "kernels/cuda/moe_router_kernels.cuh"

constexpr unsigned kThreads = 256;  // moe.cu's launch: 8 tokens a block
unsigned blocks(int N) { return static_cast<unsigned>((N * 32 + kThreads - 1) / kThreads); }

struct Case {
  int N, E, K;
  bool renormalize, sigmoid;
  bool bias = false;  // an expert bias (loss-free balancing) ranks the choice
};

void check_case(const Case& c, std::mt19937& rng, bool non_finite = false) {
  SCOPED_TRACE(testing::Message() << "N " << c.N << " E " << c.E << " K " << c.K << " renormalize " << c.renormalize
                                  << " sigmoid " << c.sigmoid << " bias " << c.bias);
  const size_t NE = static_cast<size_t>(c.N) * c.E, NK = static_cast<size_t>(c.N) * c.K;
  // Logits on a grid of 1/8 (exact ties, else apart by more than rounding), some rows
  // saturated (sigmoid scores of 1.0f: ranked by logit).
  std::uniform_int_distribution<int> grid(-24, 24);
  std::vector<float> logits(NE);
  for (size_t i = 0; i < NE; i++) logits[i] = grid(rng) / 8.0f + (i / c.E % 5 == 4 ? 20.0f : 0.0f);
  if (non_finite) {  // a NaN in some rows, +inf (a NaN softmax) in others, every logit NaN in one
    for (int t = 0; t < c.N; t += 3) logits[static_cast<size_t>(t) * c.E + (t % c.E)] = NAN;
    for (int t = 1; t < c.N; t += 3) logits[static_cast<size_t>(t) * c.E + (t % c.E)] = INFINITY;
    std::fill_n(logits.begin() + static_cast<std::ptrdiff_t>(c.E) * (c.N - 1), c.E, NAN);
  }
  const int tokens_per_sequence = 4, B = (c.N + tokens_per_sequence - 1) / tokens_per_sequence;
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> dweights(NK), balance(static_cast<size_t>(B) * c.E);
  for (float& x : dweights) x = uniform(rng);
  for (float& x : balance) x = uniform(rng);

  // A bias on a grid of 1/16 that reorders the choice (biased ranks tie exactly in places).
  std::vector<float> bias_values(c.E);
  for (float& b : bias_values) b = grid(rng) / 16.0f;
  const float* bias = c.bias ? bias_values.data() : nullptr;
  std::vector<float> probs(NE), lse(c.N), weights(NK), cpu_probs(NE), cpu_lse(c.N), cpu_weights(NK);
  std::vector<int32_t> experts(NK, -7), cpu_experts(NK);
  cpu::moe_router_forward<float>(cpu_probs.data(), cpu_lse.data(), cpu_experts.data(), cpu_weights.data(),
                                 logits.data(), bias, c.N, c.E, c.K, c.renormalize, c.sigmoid);
  launch(blocks(c.N), 1, kThreads, 0, [&] {
    router_forward_kernel<float>(probs.data(), lse.data(), experts.data(), weights.data(), logits.data(), bias, c.N,
                                 c.E, c.K, c.renormalize, c.sigmoid);
  });
  EXPECT_EQ(experts, cpu_experts);
  for (int t = 0; t < c.N; t++) {  // K distinct experts, whatever the logits
    std::vector<int32_t> mine(experts.begin() + static_cast<std::ptrdiff_t>(t) * c.K,
                              experts.begin() + static_cast<std::ptrdiff_t>(t + 1) * c.K);
    std::sort(mine.begin(), mine.end());
    ASSERT_TRUE(mine.front() >= 0 && mine.back() < c.E && std::adjacent_find(mine.begin(), mine.end()) == mine.end())
        << "token " << t;
  }
  if (non_finite) return;  // the values: NaN on both sides
  for (size_t i = 0; i < NK; i++) ASSERT_NEAR(weights[i], cpu_weights[i], 1e-6f + 1e-5f * std::fabs(cpu_weights[i]));
  for (size_t i = 0; i < NE; i++) ASSERT_NEAR(probs[i], cpu_probs[i], 1e-6f + 1e-5f * std::fabs(cpu_probs[i])) << i;
  for (int t = 0; t < c.N; t++) ASSERT_NEAR(lse[t], cpu_lse[t], 1e-5f * (1 + std::fabs(cpu_lse[t])));

  // The backward from the CPU's forward (same inputs to both), with the balance and z losses.
  std::vector<float> dlogits(NE, NAN), cpu_dlogits(NE);
  cpu::moe_router_backward<float>(cpu_dlogits.data(), cpu_probs.data(), cpu_lse.data(), cpu_experts.data(),
                                  cpu_weights.data(), dweights.data(), balance.data(), tokens_per_sequence, 0.3f,
                                  0.01f, c.N, c.E, c.K, c.renormalize, c.sigmoid);
  launch(blocks(c.N), 1, kThreads, 0, [&] {
    router_backward_kernel<float>(dlogits.data(), cpu_probs.data(), cpu_lse.data(), cpu_experts.data(),
                                  cpu_weights.data(), dweights.data(), balance.data(), tokens_per_sequence, 0.3f, 0.01f,
                                  c.N, c.E, c.K, c.renormalize, c.sigmoid);
  });
  float largest = 0;
  for (float d : cpu_dlogits) largest = std::max(largest, std::fabs(d));
  ASSERT_GT(largest, 0.0f);
  for (size_t i = 0; i < NE; i++) ASSERT_NEAR(dlogits[i], cpu_dlogits[i], 1e-5f * largest) << i;
}

TEST(MoeRouterWarpOnCpu, MatchesTheCpuKernels) {
  std::mt19937 rng(54);
  // E under, at and over a warp's 32 lanes; K up to 8; N not a multiple of a block's 8.
  for (const int E : {5, 32, 70})
    for (const int K : {1, 2, 5})
      for (const bool renormalize : {false, true})
        for (const bool sigmoid : {false, true}) check_case({13, E, K, renormalize, sigmoid}, rng);
  check_case({9, 256, 8, true, false}, rng);
  for (const bool sigmoid : {false, true}) {
    check_case({13, 70, 5, true, sigmoid, /*bias=*/true}, rng);
    check_case({13, 5, 2, false, sigmoid, /*bias=*/true}, rng);
  }
}

// A non-finite logit (a diverged step, which the trainer skips) still routes every token to
// K distinct experts, the same on both (a NaN ranked as -inf): never an expert -1 that the
// permutation and the dispatch would read out of bounds.
TEST(MoeRouterWarpOnCpu, NonFiniteLogitsStillChooseKExperts) {
  std::mt19937 rng(7);
  for (const int E : {5, 70})
    for (const bool sigmoid : {false, true}) check_case({12, E, 3, true, sigmoid}, rng, /*non_finite=*/true);
}

}  // namespace router
}  // namespace trident::kernels::cuda_sim
