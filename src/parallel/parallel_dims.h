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

#include "parallel/mesh_axes.h"

namespace trident {

enum class Axis { tp, cp, dp, pp };
// Every axis, in rank order (the first varies fastest).
inline constexpr std::array<Axis, 4> kAxes = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};
inline constexpr int kAxisCount = static_cast<int>(kAxes.size());
const char* axis_name(Axis axis);
// A grid axis as a named axis of the mesh (parallel/mesh_axes.h).
constexpr MeshAxis mesh_axis(Axis a) {
  constexpr MeshAxis named[] = {MeshAxis::tp, MeshAxis::cp, MeshAxis::dp, MeshAxis::pp};
  return named[static_cast<int>(a)];
}

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
  void set_ep(int ep);
  // (Its groups: size(MeshAxis::ep) and group_rank(c, {MeshAxis::ep}); the ranks holding
  // the same experts, MeshAxis::edp.)
  // The cuts of the grid's axes that parallel/mesh_axes.h names: sequence parallelism
  // (sp), hybrid sharding's block of dp (parallel.shard_size; 0: all of dp), and the tp
  // ranks holding each piece of a tensor cut into fewer pieces than tp (tp_piece; the
  // model's key/value heads decide: set by the training setup).
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  void set_shard_size(int shard_size);
  void set_tp_piece_holders(int holders);
  // The ranks a group along named axis `a` spans (1: the axis is not cut here), and along
  // all of `axes`.
  int size(MeshAxis a) const;
  int size(AxisSet axes) const;
  // The same ranks under one name: axes of size 1 dropped, a cut that is whole replaced by
  // its grid axis (ep when ep covers dp x cp, sp under sequence parallelism: tp), ep with
  // edp (and dp_shard with dp_replica) by the axes they cut. Two sets span the same ranks
  // exactly when their normalized sets are equal; from the sizes alone, so every rank
  // names a group alike.
  AxisSet normalized(AxisSet axes) const;
  // Whether the rank at `c` is in the group over `axes` of the rank at `me`; and that
  // group's ranks, in rank order (empty: `me` is in none, a pp_ends group off the ends).
  bool same_group(const RankCoords& c, const RankCoords& me, AxisSet axes) const;
  std::vector<int> group_ranks(const RankCoords& me, AxisSet axes) const;
  // `me`'s place in its group over `axes` (0: the first, the one that writes a piece
  // replicated over them).
  int group_rank(const RankCoords& me, AxisSet axes) const;
  // The global ranks of every group along `axis`, each group in rank order of that axis.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // "grid: dp=2 pp=2 tp=2 (8 ranks; ...)" and the groups of every axis, one line each.
  std::string describe() const;
  bool operator==(const ParallelDims&) const = default;

 private:
  bool same_normalized_group(const RankCoords& c, const RankCoords& me, AxisSet normalized) const;
  std::array<int, kAxisCount> sizes_;
  int ep_ = 1, shard_size_ = 0, tp_piece_holders_ = 1;
  bool sequence_parallel_ = false;
};

}  // namespace trident
