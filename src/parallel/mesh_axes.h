// The named axes of the mesh that state is placed over (model/placement.h) and that
// communicators span (ParallelState::group). The rank grid's axes (tp, cp, dp, pp:
// parallel/parallel_dims.h) and the axes cut from them, each a block of a grid axis or
// the same place in every block:
//   ep, edp      dp x cp (cp fastest) in blocks of parallel.ep consecutive ranks, and across
//                the blocks: a block holds every expert once, the ranks at one place in
//                every block hold the same experts (Megatron's expert and expert-data groups)
//   sp           tp under sequence parallelism (each tp rank holds its rows of the
//                sequence), nothing without it: a norm's gradient is partial over sp
//   tp_piece     tp in blocks of tp / pieces: the ranks holding the same piece of a tensor
//                cut into fewer pieces than tp (a shared key/value head)
//   pp_ends      the first and the last pipeline stage (a tied token embedding)
//   dp_shard,    hybrid sharding (parallel.shard_size): dp in blocks of shard_size
//   dp_replica   consecutive ranks (one node), and across the blocks
// An axis set is a set of these; ParallelDims says which ranks a set spans, and which
// sets span the same ranks (normalized), from the sizes alone.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace trident {

enum class MeshAxis : uint8_t { tp, cp, dp, pp, ep, edp, sp, tp_piece, pp_ends, dp_shard, dp_replica };
inline constexpr int kMeshAxisCount = 11;

const char* mesh_axis_name(MeshAxis axis);

class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<MeshAxis> axes) {
    for (MeshAxis a : axes) bits_ |= bit(a);
  }
  constexpr bool has(MeshAxis a) const { return (bits_ & bit(a)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr AxisSet operator|(AxisSet o) const { return from_bits(bits_ | o.bits_); }
  constexpr AxisSet operator&(AxisSet o) const { return from_bits(bits_ & o.bits_); }
  constexpr AxisSet operator-(AxisSet o) const { return from_bits(bits_ & ~o.bits_); }
  constexpr bool operator==(const AxisSet&) const = default;
  constexpr bool operator<(const AxisSet& o) const { return bits_ < o.bits_; }
  constexpr uint16_t bits() const { return bits_; }
  // "dp x cp", "tp", "-" for the empty set: a communicator's name.
  std::string name() const;

 private:
  static constexpr uint16_t bit(MeshAxis a) { return static_cast<uint16_t>(1u << static_cast<int>(a)); }
  static constexpr AxisSet from_bits(uint16_t b) {
    AxisSet s;
    s.bits_ = b;
    return s;
  }
  uint16_t bits_ = 0;
};

// The axes data parallelism sums gradients over and ZeRO shards over (the ranks that
// hold the same values and see different tokens): dp x cp, or a block/across cut of it.
inline constexpr AxisSet kDataAxes = {MeshAxis::dp, MeshAxis::cp, MeshAxis::ep, MeshAxis::edp, MeshAxis::dp_shard,
                                      MeshAxis::dp_replica};
// The axes the pieces of a model are spread over: a gradient norm is summed over them,
// each piece counted by the first rank holding it.
inline constexpr AxisSet kModelAxes = {MeshAxis::tp, MeshAxis::pp};

}  // namespace trident
