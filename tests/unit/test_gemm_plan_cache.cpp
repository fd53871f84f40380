// gemm.cu's cuBLASLt plan cache policy (kernels/cuda/gemm_plan_cache.h), without a GPU:
// the experts' GEMMs, a new row count per expert almost every step, make few plans, and
// the cache never holds more than its cap.
#include "kernels/cuda/gemm_plan_cache.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <tuple>

namespace trident::kernels::cuda {
namespace {

TEST(GemmPlanCache, RowsRoundUpToTwoSizesPerOctave) {
  EXPECT_EQ(plan_rows(0), kMinPlanRows);
  EXPECT_EQ(plan_rows(1), kMinPlanRows);
  EXPECT_EQ(plan_rows(64), 64);
  EXPECT_EQ(plan_rows(65), 96);
  EXPECT_EQ(plan_rows(96), 96);
  EXPECT_EQ(plan_rows(97), 128);
  EXPECT_EQ(plan_rows(129), 192);
  EXPECT_EQ(plan_rows(4096), 4096);
  EXPECT_EQ(plan_rows(4097), 6144);
  EXPECT_EQ(plan_rows((1 << 30) + 1), (1 << 30) + 1);  // past 2^30: exact, no overflow
  for (int rows = 0; rows <= 70000; rows++) {
    const int r = plan_rows(rows);
    ASSERT_GE(r, rows);
    ASSERT_TRUE(r == kMinPlanRows || 2 * r <= 3 * rows + 3) << rows << " -> " << r;  // at most 1.5x, rounded
    ASSERT_EQ(plan_rows(r), r) << rows;  // a rounded size is its own key
  }
}

struct FakePlan {
  int id = 0;
};

// An MoE layer's expert GEMMs (8 experts, C 512, F 1024, each expert 0..4096 rows per
// step): the forward (M = rows), the input gradient (M = rows) and the weight gradient
// (K = rows) of both projections, keyed as gemm() keys them: M and K rounded.
TEST(GemmPlanCache, ExpertGemmsOverRandomRoutingsMakeBoundedPlans) {
  using Key = std::tuple<bool, bool, int, int, int>;
  constexpr int kExperts = 8, kRoutings = 100, kC = 512, kF = 1024;
  size_t destroyed = 0;
  GemmPlanCache<Key, FakePlan> cache(256, [&](FakePlan&) { destroyed++; });
  size_t small_destroyed = 0;  // the same calls through a cache smaller than their keys
  GemmPlanCache<Key, FakePlan> small(32, [&](FakePlan&) { small_destroyed++; });
  std::set<Key> exact, rounded;
  std::mt19937 rng(54);
  std::uniform_int_distribution<int> rows(0, 4096);
  int next_id = 0;
  const auto gemm = [&](bool ta, bool tb, int M, int N, int K) {
    exact.insert({ta, tb, M, N, K});
    const Key key{ta, tb, plan_rows(M), N, plan_rows(K)};
    rounded.insert(key);
    cache.get(key, [&] { return FakePlan{next_id++}; });
    small.get(key, [&] { return FakePlan{next_id++}; });
    ASSERT_LE(cache.size(), cache.capacity());
    ASSERT_LE(small.size(), small.capacity());
  };
  for (int step = 0; step < kRoutings; step++)
    for (int e = 0; e < kExperts; e++) {
      const int n = rows(rng);
      gemm(false, true, n, kF, kC);  // h = x W1^T
      gemm(false, true, n, kC, kF);  // y = h W2^T
      gemm(false, false, n, kF, kC);  // dh = dy W2
      gemm(false, false, n, kC, kF);  // dx = dh W1
      gemm(true, false, kC, kF, n);  // dW2 = dy^T h
      gemm(true, false, kF, kC, n);  // dW1 = dh^T x
    }
  std::printf("%d routings x %d experts: %zu exact shapes, %zu rounded keys, %zu plans made, %zu held\n", kRoutings,
              kExperts, exact.size(), rounded.size(), cache.created(), cache.size());
  EXPECT_EQ(cache.created(), rounded.size());  // each rounded key planned once (under the cap)
  EXPECT_LE(cache.created(), 6u * 13);  // 6 GEMMs x the 13 sizes 64, 96, 128, 192, ..., 4096
  EXPECT_GT(exact.size(), 10 * cache.created());  // what planning per exact shape would have made
  EXPECT_EQ(destroyed, 0u);
  std::printf("through a cache of 32: %zu plans made, %zu destroyed, %zu held\n", small.created(), small_destroyed,
              small.size());
  EXPECT_EQ(small.size(), 32u);
  EXPECT_EQ(small_destroyed, small.created() - small.size());  // every plan evicted was destroyed
}

TEST(GemmPlanCache, EvictsAndDestroysTheLeastRecentlyUsedOverItsCap) {
  size_t destroyed = 0, created = 0;
  std::set<int> destroyed_keys;
  {
    GemmPlanCache<int, int> cache(4, [&](int& plan) {
      destroyed++;
      destroyed_keys.insert(plan);
    });
    const auto make = [](int key) { return [key] { return key; }; };
    for (int key = 0; key < 4; key++) cache.get(key, make(key));
    cache.get(0, make(0));  // 0 used again: 1 is now the least recently used
    EXPECT_EQ(cache.created(), 4u);
    cache.get(4, make(4));
    EXPECT_EQ(cache.size(), 4u);
    EXPECT_EQ(destroyed_keys, std::set<int>{1});
    cache.get(1, make(1));  // made again, evicting 2
    EXPECT_EQ(cache.created(), 6u);
    EXPECT_EQ(destroyed_keys, (std::set<int>{1, 2}));
    EXPECT_EQ(cache.evicted(), 2u);

    // Random keys: never over the cap; every plan made is destroyed once (here or below).
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> keys(0, 40);
    for (int i = 0; i < 1000; i++) {
      const int key = keys(rng);
      ASSERT_EQ(cache.get(key, make(key)), key);
      ASSERT_LE(cache.size(), 4u);
    }
    EXPECT_EQ(destroyed, cache.evicted());
    created = cache.created();
  }
  EXPECT_EQ(destroyed, created);  // the cache's end destroys the 4 it held
}

}  // namespace
}  // namespace trident::kernels::cuda
