// The rank grid: world = dp * pp * tp, ranks ordered tp fastest, then dp, then pp:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a tensor-parallel group is consecutive ranks (one node) and pipeline stages cross
// nodes. Pure arithmetic, no MPI: tested without processes.
//
// Example, 8 ranks as dp=2, pp=2, tp=2:
//   tp groups: {0,1} {2,3} {4,5} {6,7}
//   dp groups: {0,2} {1,3} {4,6} {5,7}
//   pp groups: {0,4} {1,5} {2,6} {3,7}
#pragma once

#include <string>
#include <vector>

namespace trident {

enum class Axis { tp, dp, pp };
const char* axis_name(Axis axis);

struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
  int operator[](Axis a) const { return a == Axis::tp ? tp : a == Axis::dp ? dp : pp; }
  bool operator==(const RankCoords&) const = default;
};

struct ParallelDims {
  int dp = 1, pp = 1, tp = 1;

  // Fills in dp = 0 from the world size and checks dp * pp * tp == world; throws
  // UsageError naming the sizes otherwise.
  static ParallelDims resolve(int world, int dp, int pp, int tp);

  int world() const { return dp * pp * tp; }
  int size(Axis a) const { return a == Axis::tp ? tp : a == Axis::dp ? dp : pp; }
  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& c) const { return c.tp + tp * (c.dp + dp * c.pp); }
  // The global ranks of every group along `axis`, each group in rank order of that axis.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // "dp=2 pp=2 tp=2 (8 ranks)" and the groups of every axis, one line each.
  std::string describe() const;
};

}  // namespace trident
