// The rank grid as pure arithmetic: rank order tp fastest, then dp, then pp; groups;
// and layouts that cannot work.
#include <gtest/gtest.h>

#include "parallel/parallel_dims.h"
#include "runtime/error.h"

namespace trident {
namespace {

TEST(ParallelDims, EightRanksAsTwoByTwoByTwo) {
  const ParallelDims d = ParallelDims::resolve(8, 2, 2, 2);
  EXPECT_EQ(d.world(), 8);
  // rank = tp_rank + tp * (dp_rank + dp * pp_rank)
  EXPECT_EQ(d.coords(0), (RankCoords{0, 0, 0}));
  EXPECT_EQ(d.coords(1), (RankCoords{1, 0, 0}));
  EXPECT_EQ(d.coords(2), (RankCoords{0, 1, 0}));
  EXPECT_EQ(d.coords(5), (RankCoords{1, 0, 1}));
  EXPECT_EQ(d.coords(7), (RankCoords{1, 1, 1}));
  for (int r = 0; r < 8; r++) EXPECT_EQ(d.rank_of(d.coords(r)), r);
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(d.groups(Axis::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(d.groups(Axis::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(d.groups(Axis::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ParallelDims, DerivesDpAndCoversOddSizes) {
  const ParallelDims d = ParallelDims::resolve(12, 0, 2, 3);  // dp = 12 / (2*3)
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.groups(Axis::tp).size(), 4u);
  EXPECT_EQ(d.groups(Axis::tp)[1], (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(d.groups(Axis::dp)[0], (std::vector<int>{0, 3}));
  EXPECT_EQ(d.groups(Axis::pp)[0], (std::vector<int>{0, 6}));
  // Every rank is in exactly one group of each axis.
  for (Axis axis : {Axis::tp, Axis::dp, Axis::pp}) {
    std::vector<int> seen(12, 0);
    for (const auto& g : d.groups(axis))
      for (int r : g) seen[r]++;
    EXPECT_EQ(seen, std::vector<int>(12, 1)) << axis_name(axis);
  }
  EXPECT_EQ(ParallelDims::resolve(3, 0, 1, 1).dp, 3);
  EXPECT_NE(d.describe().find("tp groups: {0,1,2} {3,4,5}"), std::string::npos) << d.describe();
}

TEST(ParallelDims, InvalidLayouts) {
  EXPECT_THROW(ParallelDims::resolve(10, 0, 1, 4), UsageError);  // world 10 is no multiple of tp 4
  EXPECT_THROW(ParallelDims::resolve(8, 3, 1, 2), UsageError);   // 3*1*2 != 8
  EXPECT_THROW(ParallelDims::resolve(8, 2, 0, 2), UsageError);   // pp 0
  EXPECT_THROW(ParallelDims::resolve(8, -1, 1, 1), UsageError);
  std::string message;  // the error names the world size (and fails the test when there is none)
  try {
    ParallelDims::resolve(10, 0, 1, 4);
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("world size 10"), std::string::npos) << "'" << message << "'";
}

}  // namespace
}  // namespace trident
