#include "parallel/parallel_dims.h"

#include <algorithm>
#include <sstream>

#include "kernels/base/error.h"

namespace trident {

namespace {

constexpr std::array<const char*, kAxisCount> kAxisNames = {"tp", "cp", "dp", "pp"};
static_assert(kAxisNames.back() != nullptr, "every axis of kAxes needs its name");

// The axes as messages list them, as the config's keys read: dp, then from the slowest
// axis to the fastest (dp, pp, tp).
std::vector<Axis> display_order() {
  std::vector<Axis> order = {Axis::dp};
  for (int i = kAxisCount - 1; i >= 0; i--)
    if (kAxes[i] != Axis::dp) order.push_back(kAxes[i]);
  return order;
}

// "tp*pp" and "1*4" for the axes in `axes`, in that order.
std::string product(const std::vector<Axis>& axes, const std::array<int, kAxisCount>& sizes, bool values) {
  std::string s;
  for (Axis a : axes)
    s += (s.empty() ? "" : "*") + (values ? std::to_string(sizes[static_cast<int>(a)]) : std::string(axis_name(a)));
  return s;
}

}  // namespace

const char* axis_name(Axis axis) { return kAxisNames[static_cast<int>(axis)]; }

const char* mesh_axis_name(MeshAxis axis) {
  static constexpr std::array<const char*, kMeshAxisCount> names = {
      "tp", "cp", "dp", "pp", "ep", "expert dp", "sp", "tp piece", "pp ends", "dp shard", "dp replica"};
  return names[static_cast<int>(axis)];
}

std::string AxisSet::name() const {
  // As the config's keys read: dp first ("dp x cp").
  using M = MeshAxis;
  std::string s;
  for (M a : {M::dp, M::cp, M::tp, M::pp, M::ep, M::edp, M::sp, M::tp_piece, M::pp_ends, M::dp_shard, M::dp_replica})
    if (has(a)) s += (s.empty() ? "" : " x ") + std::string(mesh_axis_name(a));
  return s.empty() ? "-" : s;
}

ParallelDims ParallelDims::resolve(int world, const std::vector<AxisSize>& sizes) {
  require(world > 0, "world size must be positive");
  ParallelDims d;
  for (const AxisSize& s : sizes) {
    require(s.size >= 0 && (s.size > 0 || s.axis == Axis::dp),
            "parallel sizes must be positive (dp may be 0: derived)");
    d.sizes_[static_cast<int>(s.axis)] = s.size;
  }
  std::vector<Axis> fixed;
  for (Axis a : kAxes)  // tp, pp: in rank order, as the message has always named them
    if (a != Axis::dp) fixed.push_back(a);
  int fixed_ranks = 1;
  for (Axis a : fixed) fixed_ranks *= d.size(a);
  std::string named;
  for (Axis a : fixed) named += std::string(named.empty() ? "" : ", ") + axis_name(a) + "=" + std::to_string(d.size(a));
  require(world % fixed_ranks == 0, "world size " + std::to_string(world) + " is not a multiple of " +
                                        product(fixed, d.sizes_, false) + " = " + std::to_string(fixed_ranks) +
                                        " (" + named + ")");
  if (d.size(Axis::dp) == 0) d.sizes_[static_cast<int>(Axis::dp)] = world / fixed_ranks;
  const std::vector<Axis> all = display_order();
  require(d.world() == world, product(all, d.sizes_, false) + " = " + product(all, d.sizes_, true) + " = " +
                                  std::to_string(d.world()) + " but the world has " + std::to_string(world) +
                                  " ranks");
  return d;
}

int ParallelDims::world() const {
  int n = 1;
  for (int s : sizes_) n *= s;
  return n;
}

RankCoords ParallelDims::coords(int rank) const {
  RankCoords c;
  for (Axis a : kAxes) {
    c[a] = rank % size(a);
    rank /= size(a);
  }
  return c;
}

int ParallelDims::rank_of(const RankCoords& c) const {
  int rank = 0;
  for (int i = kAxisCount - 1; i >= 0; i--) rank = rank * size(kAxes[i]) + c[kAxes[i]];
  return rank;
}

std::vector<std::vector<int>> ParallelDims::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int rank = 0; rank < world(); rank++) {
    const RankCoords c = coords(rank);
    if (c[axis] != 0) continue;  // each group is listed once, from its first member
    std::vector<int> group;
    for (int i = 0; i < size(axis); i++) group.push_back(rank_of(c.with(axis, i)));
    out.push_back(std::move(group));
  }
  return out;
}

void ParallelDims::set_ep(int ep) {
  if (ep < 1 || data_parallel_size() % ep != 0)
    throw UsageError("parallel.ep (" + std::to_string(ep) + ") must divide dp x cp (" +
                     std::to_string(size(Axis::dp)) + " x " + std::to_string(size(Axis::cp)) +
                     "): the experts are split over data-parallel ranks");
  ep_ = ep;
}

void ParallelDims::set_shard_size(int shard_size) {
  // One that does not divide dp is refused with the layout (plan/run_layout.cpp), by name.
  shard_size_ = shard_size > 0 && size(Axis::dp) % shard_size == 0 ? shard_size : 0;
}

void ParallelDims::set_tp_piece_holders(int holders) {
  check(holders >= 1 && size(Axis::tp) % holders == 0, "the ranks holding a piece must divide tp");
  tp_piece_holders_ = holders;
}

int ParallelDims::size(MeshAxis a) const {
  const int dp = size(Axis::dp), shard = shard_size_ > 0 ? shard_size_ : dp;
  switch (a) {
    case MeshAxis::tp: return size(Axis::tp);
    case MeshAxis::cp: return size(Axis::cp);
    case MeshAxis::dp: return dp;
    case MeshAxis::pp: return size(Axis::pp);
    case MeshAxis::ep: return ep_;
    case MeshAxis::edp: return data_parallel_size() / ep_;
    case MeshAxis::sp: return sequence_parallel_ ? size(Axis::tp) : 1;
    case MeshAxis::tp_piece: return tp_piece_holders_;
    case MeshAxis::pp_ends: return std::min(size(Axis::pp), 2);
    case MeshAxis::dp_shard: return shard;
    case MeshAxis::dp_replica: return dp / shard;
  }
  return 1;
}

int ParallelDims::size(AxisSet axes) const {
  const AxisSet s = normalized(axes);
  int n = 1;
  for (int i = 0; i < kMeshAxisCount; i++)
    if (s.has(static_cast<MeshAxis>(i))) n *= size(static_cast<MeshAxis>(i));
  return n;
}

AxisSet ParallelDims::normalized(AxisSet axes) const {
  using M = MeshAxis;
  const auto replace = [&axes](M cut, AxisSet by) { axes = (axes - AxisSet{cut}) | by; };
  // A cut spanning its whole grid axis is that axis.
  if (axes.has(M::ep) && ep_ == data_parallel_size()) replace(M::ep, {M::dp, M::cp});
  if (axes.has(M::edp) && ep_ == 1) replace(M::edp, {M::dp, M::cp});
  if (axes.has(M::ep) && axes.has(M::edp)) axes = (axes - AxisSet{M::ep, M::edp}) | AxisSet{M::dp, M::cp};
  if (axes.has(M::sp) && size(M::sp) == size(Axis::tp)) replace(M::sp, {M::tp});
  if (axes.has(M::tp_piece) && tp_piece_holders_ == size(Axis::tp)) replace(M::tp_piece, {M::tp});
  if (axes.has(M::pp_ends) && size(Axis::pp) <= 2) replace(M::pp_ends, {M::pp});
  if (axes.has(M::dp_shard) && size(M::dp_shard) == size(Axis::dp)) replace(M::dp_shard, {M::dp});
  if (axes.has(M::dp_shard) && axes.has(M::dp_replica)) axes = (axes - AxisSet{M::dp_shard, M::dp_replica}) | AxisSet{M::dp};
  // A whole axis contains its cuts.
  if (axes.has(M::tp)) axes = axes - AxisSet{M::sp, M::tp_piece};
  if (axes.has(M::pp)) axes = axes - AxisSet{M::pp_ends};
  if (axes.has(M::dp)) axes = axes - AxisSet{M::dp_shard, M::dp_replica};
  if (axes.has(M::dp) && axes.has(M::cp)) axes = axes - AxisSet{M::ep, M::edp};
  AxisSet kept;
  for (int i = 0; i < kMeshAxisCount; i++) {
    const M a = static_cast<M>(i);
    if (axes.has(a) && size(a) > 1) kept = kept | AxisSet{a};
  }
  check(!(kept & AxisSet{M::ep, M::edp}).empty() + !(kept & AxisSet{M::dp, M::cp, M::dp_shard, M::dp_replica}).empty() < 2,
        "an axis set cuts dp x cp two ways (" + axes.name() + ")");
  return kept;
}

bool ParallelDims::same_group(const RankCoords& c, const RankCoords& me, AxisSet axes) const {
  return same_normalized_group(c, me, normalized(axes));
}

bool ParallelDims::same_normalized_group(const RankCoords& c, const RankCoords& me, AxisSet s) const {
  using M = MeshAxis;
  // Along one grid axis: anywhere, in my block of `block`, or at my place in every block.
  const auto along = [](int a, int b, bool whole, bool within, bool across, int block) {
    if (whole || (within && across)) return true;
    if (within) return a / block == b / block;
    if (across) return a % block == b % block;
    return a == b;
  };
  const int pp = size(Axis::pp);
  if (!along(c[Axis::tp], me[Axis::tp], s.has(M::tp), s.has(M::tp_piece), false, tp_piece_holders_)) return false;
  if (s.has(M::pp_ends)) {
    const auto end = [pp](int stage) { return stage == 0 || stage == pp - 1; };
    if (!end(c[Axis::pp]) || !end(me[Axis::pp])) return false;
  } else if (!s.has(M::pp) && c[Axis::pp] != me[Axis::pp]) {
    return false;
  }
  if (s.has(M::ep) || s.has(M::edp))
    return along(data_parallel_rank(c), data_parallel_rank(me), false, s.has(M::ep), s.has(M::edp), ep_);
  if (!s.has(M::cp) && c[Axis::cp] != me[Axis::cp]) return false;
  return along(c[Axis::dp], me[Axis::dp], s.has(M::dp), s.has(M::dp_shard), s.has(M::dp_replica), size(M::dp_shard));
}

std::vector<int> ParallelDims::group_ranks(const RankCoords& me, AxisSet axes) const {
  const AxisSet s = normalized(axes);
  std::vector<int> ranks;
  for (int r = 0; r < world(); r++)
    if (same_normalized_group(coords(r), me, s)) ranks.push_back(r);
  return ranks;
}

int ParallelDims::group_rank(const RankCoords& me, AxisSet axes) const {
  const std::vector<int> ranks = group_ranks(me, axes);
  const auto at = std::find(ranks.begin(), ranks.end(), rank_of(me));
  check(at != ranks.end(), "a rank outside its own group");
  return static_cast<int>(at - ranks.begin());
}

std::string ParallelDims::describe() const {
  std::ostringstream s;
  // The sizes, dp first and then from the slowest axis (dp=2 pp=2 tp=2), then the rank
  // formula in rank order.
  s << "grid:";
  for (Axis a : display_order()) s << " " << axis_name(a) << "=" << size(a);
  s << " (" << world() << " ranks; rank = ";
  std::string formula = std::string(axis_name(kAxes.back())) + "_rank";
  for (int i = kAxisCount - 2; i >= 0; i--) {
    const std::string name = axis_name(kAxes[i]);
    formula = name + "_rank + " + name + "*" + (i == kAxisCount - 2 ? formula : "(" + formula + ")");
  }
  s << formula << ")";
  for (Axis axis : kAxes) {
    s << "\n  " << axis_name(axis) << " groups:";
    for (const auto& g : groups(axis)) {
      s << " {";
      for (size_t i = 0; i < g.size(); i++) s << (i ? "," : "") << g[i];
      s << "}";
    }
  }
  if (ep_ > 1) {
    // The ep groups: consecutive data-parallel ranks of each (tp, pp) column.
    s << "\n  ep groups:";
    for (int pp = 0; pp < size(Axis::pp); pp++)
      for (int tp = 0; tp < size(Axis::tp); tp++)
        for (int first = 0; first < data_parallel_size(); first += ep_) {
          s << " {";
          for (int i = first; i < first + ep_; i++) {
            RankCoords c;
            c[Axis::tp] = tp;
            c[Axis::pp] = pp;
            c[Axis::cp] = i % size(Axis::cp);
            c[Axis::dp] = i / size(Axis::cp);
            s << (i > first ? "," : "") << rank_of(c);
          }
          s << "}";
        }
  }
  return s.str();
}

}  // namespace trident
