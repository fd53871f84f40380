// The rank grid as pure arithmetic: rank order tp fastest, then dp, then pp; groups;
// and layouts that cannot work.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/context_parallel.h"
#include "parallel/parallel_dims.h"
#include "runtime/flat_range.h"
#include "kernels/base/error.h"

namespace trident {
namespace {

// The coordinates (tp, dp, pp) as one value, for comparing.
RankCoords at(int tp, int dp, int pp) {
  return RankCoords().with(Axis::tp, tp).with(Axis::dp, dp).with(Axis::pp, pp);
}

TEST(ParallelDims, EightRanksAsTwoByTwoByTwo) {
  const ParallelDims d = ParallelDims::resolve(8, {{Axis::dp, 2}, {Axis::pp, 2}, {Axis::tp, 2}});
  EXPECT_EQ(d.world(), 8);
  // rank = tp_rank + tp * (dp_rank + dp * pp_rank)
  EXPECT_EQ(d.coords(0), at(0, 0, 0));
  EXPECT_EQ(d.coords(1), at(1, 0, 0));
  EXPECT_EQ(d.coords(2), at(0, 1, 0));
  EXPECT_EQ(d.coords(5), at(1, 0, 1));
  EXPECT_EQ(d.coords(7), at(1, 1, 1));
  EXPECT_EQ(d.coords(6)[Axis::dp], 1);
  for (int r = 0; r < 8; r++) EXPECT_EQ(d.rank_of(d.coords(r)), r);
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(d.groups(Axis::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(d.groups(Axis::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(d.groups(Axis::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ParallelDims, DerivesDpAndCoversOddSizes) {
  const ParallelDims d = ParallelDims::resolve(12, {{Axis::dp, 0}, {Axis::pp, 2}, {Axis::tp, 3}});  // dp = 12 / (2*3)
  EXPECT_EQ(d.size(Axis::dp), 2);
  EXPECT_EQ(d.groups(Axis::tp).size(), 4u);
  EXPECT_EQ(d.groups(Axis::tp)[1], (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(d.groups(Axis::dp)[0], (std::vector<int>{0, 3}));
  EXPECT_EQ(d.groups(Axis::pp)[0], (std::vector<int>{0, 6}));
  // Every rank is in exactly one group of each axis.
  for (Axis axis : kAxes) {
    std::vector<int> seen(12, 0);
    for (const auto& g : d.groups(axis))
      for (int r : g) seen[r]++;
    EXPECT_EQ(seen, std::vector<int>(12, 1)) << axis_name(axis);
  }
  EXPECT_EQ(ParallelDims::resolve(3, {{Axis::dp, 0}}).size(Axis::dp), 3);
  EXPECT_EQ(ParallelDims::resolve(3, {{Axis::dp, 0}}).size(Axis::tp), 1);  // axes not named: 1
  EXPECT_NE(d.describe().find("tp groups: {0,1,2} {3,4,5}"), std::string::npos) << d.describe();
  EXPECT_NE(d.describe().find("grid: dp=2 pp=2 cp=1 tp=3 (12 ranks; rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)))"),
            std::string::npos)
      << d.describe();
}

TEST(ParallelDims, ContextParallelSitsBetweenTpAndDp) {
  // 8 ranks as tp 2, cp 2, dp 2 (Megatron's order tp-cp-dp-pp): a cp group is ranks tp
  // apart, a dp group tp*cp apart; the dp x cp group (gradients, ZeRO) is both.
  const ParallelDims d = ParallelDims::resolve(8, {{Axis::dp, 0}, {Axis::cp, 2}, {Axis::tp, 2}});
  EXPECT_EQ(d.size(Axis::dp), 2);
  EXPECT_EQ(d.groups(Axis::tp), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(d.groups(Axis::cp), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(d.groups(Axis::dp), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const RankCoords c = d.coords(6);
  EXPECT_EQ(c[Axis::tp], 0);
  EXPECT_EQ(c[Axis::cp], 1);
  EXPECT_EQ(c[Axis::dp], 1);
}

TEST(ParallelDims, ExpertParallelFoldsIntoDpTimesCp) {
  // 8 ranks as tp 2, cp 2, dp 2 with ep 4: the data-parallel ranks of a tp column (cp
  // fastest) are all in one ep group, ranks tp apart; with ep 2, pairs of cp neighbours.
  ParallelDims d = ParallelDims::resolve(8, {{Axis::dp, 0}, {Axis::cp, 2}, {Axis::tp, 2}});
  d.set_ep(4);
  EXPECT_EQ(d.size(MeshAxis::edp), 1);
  EXPECT_EQ(d.group_rank(d.coords(6), {MeshAxis::ep}), 3);  // cp 1, dp 1: data-parallel rank 3
  EXPECT_NE(d.describe().find("ep groups: {0,2,4,6} {1,3,5,7}"), std::string::npos) << d.describe();
  d.set_ep(2);
  EXPECT_EQ(d.group_rank(d.coords(6), {MeshAxis::ep}), 1);
  EXPECT_EQ(d.group_rank(d.coords(6), {MeshAxis::edp}), 1);
  EXPECT_NE(d.describe().find("ep groups: {0,2} {4,6} {1,3} {5,7}"), std::string::npos) << d.describe();
  EXPECT_THROW(d.set_ep(3), UsageError);
  // The buckets of a flat buffer cut at the experts' runs.
  const std::vector<FlatRange> pieces = split_at({{0, 64}, {64, 128}}, {{16, 48}, {96, 128}});
  const std::vector<std::pair<size_t, size_t>> expected = {{0, 16}, {16, 48}, {48, 64}, {64, 96}, {96, 128}};
  ASSERT_EQ(pieces.size(), expected.size());
  for (size_t i = 0; i < pieces.size(); i++) {
    EXPECT_EQ(std::make_pair(pieces[i].begin, pieces[i].end), expected[i]);
    EXPECT_EQ(within(pieces[i], {{16, 48}, {96, 128}}), i == 1 || i == 4);
  }
}

// The mesh's named axes: which ranks each set spans, which sets span the same ranks (one
// communicator for both), and each rank's place in its group (0 writes a replicated piece).
TEST(ParallelDims, NamedAxesSpanTheirRanks) {
  using M = MeshAxis;
  // 16 ranks as tp 4, cp 2, dp 2 (pp 1), ep 2, kv pieces held by 2 tp ranks each.
  ParallelDims d = ParallelDims::resolve(16, {{Axis::dp, 0}, {Axis::cp, 2}, {Axis::tp, 4}});
  d.set_ep(2);
  d.set_tp_piece_holders(2);
  const RankCoords r5 = d.coords(5);  // tp 1, cp 1, dp 0: data-parallel rank 1
  EXPECT_EQ(d.group_ranks(r5, {M::tp}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(d.group_ranks(r5, {M::tp_piece}), (std::vector<int>{4, 5}));
  EXPECT_EQ(d.group_ranks(r5, {M::dp, M::cp}), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(d.group_ranks(r5, {M::ep}), (std::vector<int>{1, 5}));    // data-parallel ranks 0, 1
  EXPECT_EQ(d.group_ranks(r5, {M::edp}), (std::vector<int>{5, 13}));  // 1 and 3: the same experts
  EXPECT_EQ(d.group_rank(r5, {M::edp}), 0);
  EXPECT_EQ(d.group_rank(d.coords(13), {M::edp}), 1);
  EXPECT_EQ(d.size(AxisSet{M::edp}), 2);
  // Sets spanning the same ranks normalize alike: ep with edp is dp x cp; sp without
  // sequence parallelism is nothing, with it tp; pp_ends of one stage is nothing.
  EXPECT_EQ(d.normalized({M::ep, M::edp}), d.normalized({M::dp, M::cp}));
  EXPECT_EQ(d.normalized({M::sp, M::pp_ends}), AxisSet{});
  d.set_sequence_parallel(true);
  EXPECT_EQ(d.normalized({M::sp}), AxisSet{M::tp});
  EXPECT_EQ(AxisSet({M::cp, M::dp}).name(), "dp x cp");
  // ep 1: an expert's holders are all of dp x cp.
  d.set_ep(1);
  EXPECT_EQ(d.normalized({M::edp}), d.normalized({M::dp, M::cp}));
  // 8 stages' ends, and hybrid sharding's blocks of dp.
  ParallelDims p = ParallelDims::resolve(32, {{Axis::dp, 4}, {Axis::pp, 8}});
  p.set_shard_size(2);
  EXPECT_EQ(p.group_ranks(p.coords(1), {M::pp_ends}), (std::vector<int>{1, 29}));
  EXPECT_TRUE(p.group_ranks(p.coords(5), {M::pp_ends}).empty());  // stage 1: in none
  EXPECT_EQ(p.group_ranks(p.coords(1), {M::dp_shard}), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.group_ranks(p.coords(1), {M::dp_replica}), (std::vector<int>{1, 3}));
  EXPECT_EQ(p.normalized({M::dp_shard, M::dp_replica}), AxisSet{M::dp});
}

TEST(ContextParallel, ChunksBalanceTheCausalWork) {
  // 16 tokens over cp 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(context_positions(16, 2, 0), (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(context_positions(16, 2, 1), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(context_positions(6, 1, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  // Every rank's causal work (keys at or before each of its positions) is the same.
  for (int cp : {2, 3, 4}) {
    std::vector<int> seen;
    for (int r = 0; r < cp; r++) {
      int work = 0;
      for (int32_t p : context_positions(24, cp, r)) work += p + 1;
      seen.push_back(work);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), seen[0]), cp) << "cp " << cp;
  }
  // A batch's share: rows of 8 tokens, rank 1 of cp 2 takes positions 2..5 of each.
  const std::vector<int32_t> full = {0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17};
  std::vector<int32_t> mine(8);
  take_positions(full.data(), 2, 8, context_positions(8, 2, 1), mine.data());
  EXPECT_EQ(mine, (std::vector<int32_t>{2, 3, 4, 5, 12, 13, 14, 15}));
}

TEST(ParallelDims, InvalidLayouts) {
  const auto error = [](int world, const std::vector<AxisSize>& sizes) {
    try {
      ParallelDims::resolve(world, sizes);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // world 10 is no multiple of tp 4: the error names the world size and the fixed axes
  EXPECT_EQ(error(10, {{Axis::dp, 0}, {Axis::tp, 4}}), "world size 10 is not a multiple of tp*cp*pp = 4 (tp=4, cp=1, pp=1)");
  EXPECT_EQ(error(8, {{Axis::dp, 3}, {Axis::tp, 2}}), "dp*pp*cp*tp = 3*1*1*2 = 6 but the world has 8 ranks");
  EXPECT_THROW(ParallelDims::resolve(8, {{Axis::dp, 2}, {Axis::pp, 0}, {Axis::tp, 2}}), UsageError);  // pp 0
  EXPECT_THROW(ParallelDims::resolve(8, {{Axis::dp, -1}}), UsageError);
  EXPECT_THROW(ParallelDims::resolve(0, {}), UsageError);
}

}  // namespace
}  // namespace trident
