#include "parallel/parallel_dims.h"

#include <sstream>

#include "runtime/error.h"

namespace trident {

const char* axis_name(Axis axis) { return axis == Axis::tp ? "tp" : axis == Axis::dp ? "dp" : "pp"; }

ParallelDims ParallelDims::resolve(int world, int dp, int pp, int tp) {
  require(world > 0, "world size must be positive");
  require(tp > 0 && pp > 0 && dp >= 0, "parallel sizes must be positive (dp may be 0: derived)");
  require(world % (tp * pp) == 0, "world size " + std::to_string(world) + " is not a multiple of tp*pp = " +
                                      std::to_string(tp * pp) + " (tp=" + std::to_string(tp) +
                                      ", pp=" + std::to_string(pp) + ")");
  ParallelDims d{dp == 0 ? world / (tp * pp) : dp, pp, tp};
  require(d.world() == world, "dp*pp*tp = " + std::to_string(d.dp) + "*" + std::to_string(pp) + "*" +
                                  std::to_string(tp) + " = " + std::to_string(d.world()) +
                                  " but the world has " + std::to_string(world) + " ranks");
  return d;
}

RankCoords ParallelDims::coords(int rank) const {
  return {rank % tp, rank / tp % dp, rank / (tp * dp)};
}

std::vector<std::vector<int>> ParallelDims::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int rank = 0; rank < world(); rank++) {
    RankCoords c = coords(rank);
    if (c[axis] != 0) continue;  // each group is listed once, from its first member
    std::vector<int> group;
    for (int i = 0; i < size(axis); i++) {
      RankCoords member = c;
      (axis == Axis::tp ? member.tp : axis == Axis::dp ? member.dp : member.pp) = i;
      group.push_back(rank_of(member));
    }
    out.push_back(std::move(group));
  }
  return out;
}

std::string ParallelDims::describe() const {
  std::ostringstream s;
  s << "grid: dp=" << dp << " pp=" << pp << " tp=" << tp << " (" << world() << " ranks; rank = tp_rank + tp*(dp_rank + dp*pp_rank))";
  for (Axis axis : {Axis::tp, Axis::dp, Axis::pp}) {
    s << "\n  " << axis_name(axis) << " groups:";
    for (const auto& g : groups(axis)) {
      s << " {";
      for (size_t i = 0; i < g.size(); i++) s << (i ? "," : "") << g[i];
      s << "}";
    }
  }
  return s.str();
}

}  // namespace trident
