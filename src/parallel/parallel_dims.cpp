#include "parallel/parallel_dims.h"

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

void ParallelDims::set_expert_parallel(int ep) {
  if (ep < 1 || data_parallel_size() % ep != 0)
    throw UsageError("parallel.ep (" + std::to_string(ep) + ") must divide dp x cp (" +
                     std::to_string(size(Axis::dp)) + " x " + std::to_string(size(Axis::cp)) +
                     "): the experts are split over data-parallel ranks");
  ep_ = ep;
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
