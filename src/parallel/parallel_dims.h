// The rank grid: the world as a product of named axes, ranks ordered by kAxes with the
// first axis fastest. Today tp, cp, dp, pp:
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// so a tensor-parallel group is consecutive ranks (one node), context parallelism next to
// it, and pipeline stages cross nodes (Megatron's RankGenerator with order "tp-cp-dp-pp"). Pure arithmetic, no MPI:
// tested without processes.
//
// A new axis is one entry in Axis, kAxes and kAxisNames (its place in kAxes is its place
// in the rank order) plus its size key in the config.
//
// Example, 8 ranks as dp=2, pp=2, tp=2:
//   tp groups: {0,1} {2,3} {4,5} {6,7}
//   dp groups: {0,2} {1,3} {4,6} {5,7}
//   pp groups: {0,4} {1,5} {2,6} {3,7}
#pragma once

#include <array>
#include <string>
#include <vector>

namespace trident {

enum class Axis { tp, cp, dp, pp };
// Every axis, in rank order (the first varies fastest).
inline constexpr std::array<Axis, 4> kAxes = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};
inline constexpr int kAxisCount = static_cast<int>(kAxes.size());
const char* axis_name(Axis axis);

// One rank's place on every axis.
class RankCoords {
 public:
  int operator[](Axis a) const { return at_[static_cast<int>(a)]; }
  int& operator[](Axis a) { return at_[static_cast<int>(a)]; }
  // These coordinates with one axis moved (a group's first member: with(axis, 0)).
  RankCoords with(Axis a, int value) const {
    RankCoords c = *this;
    c[a] = value;
    return c;
  }
  bool operator==(const RankCoords&) const = default;

 private:
  std::array<int, kAxisCount> at_{};
};

// An axis and its size, for ParallelDims::resolve: {{Axis::tp, 2}, {Axis::pp, 4}}.
struct AxisSize {
  Axis axis;
  int size;
};

class ParallelDims {
 public:
  // One rank: every axis of size 1.
  ParallelDims() { sizes_.fill(1); }

  // The grid of `world` ranks with these sizes (axes not named: 1). dp may be 0: derived
  // from the world size and the other axes. Throws UsageError naming the sizes when they
  // cannot make the world.
  static ParallelDims resolve(int world, const std::vector<AxisSize>& sizes);

  int size(Axis a) const { return sizes_[static_cast<int>(a)]; }
  int world() const;
  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& c) const;
  // The ranks that hold the same parameters and sum their gradients: dp x cp (context
  // parallelism's ranks see different tokens of the same sequences, as dp ranks see
  // different sequences; Megatron's data-parallel-with-cp group), and a rank's place
  // among them, cp fastest. ZeRO shards over them; replica 0 writes checkpoints.
  int data_parallel_size() const { return size(Axis::dp) * size(Axis::cp); }
  int data_parallel_rank(const RankCoords& c) const { return c[Axis::cp] + size(Axis::cp) * c[Axis::dp]; }
  // Expert parallelism (a mixture of experts' experts split over ranks): the data-parallel
  // ranks (dp x cp, cp fastest) in blocks of ep consecutive ones; a block holds every
  // expert once (ep rank q: experts [q E/ep, (q+1) E/ep)) and exchanges its tokens. The
  // ranks at the same place in every block hold the same experts (the expert-data-parallel
  // group: their expert gradients are summed and ZeRO shards them). Megatron's expert
  // order tp-cp-ep-dp-pp with cp folded in: an ep group is as close as dp x cp allows.
  // Not an axis of the rank order: ep folds into dp x cp. Throws UsageError unless ep
  // divides dp x cp.
  void set_expert_parallel(int ep);
  int expert_parallel_size() const { return ep_; }
  int expert_parallel_rank(const RankCoords& c) const { return data_parallel_rank(c) % ep_; }
  int expert_data_parallel_size() const { return data_parallel_size() / ep_; }
  int expert_data_parallel_rank(const RankCoords& c) const { return data_parallel_rank(c) / ep_; }
  // The global ranks of every group along `axis`, each group in rank order of that axis.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // "grid: dp=2 pp=2 tp=2 (8 ranks; ...)" and the groups of every axis, one line each.
  std::string describe() const;
  bool operator==(const ParallelDims&) const = default;

 private:
  std::array<int, kAxisCount> sizes_;
  int ep_ = 1;
};

}  // namespace trident
