// Which pieces of its state a rank writes into a checkpoint, and which it reads back.
// A piece is a canonical tensor's tp shard of one kind (params, or a state buffer of the
// optimizer): one dataset of a node file (ckpt/checkpoint_format.h). Of the ranks holding
// the same piece, one writes it (CheckpointWriter); a rank reads its own piece where the
// checkpoint has it, else reshards the tensor from every saved shard.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ckpt/checkpoint_format.h"
#include "model/parameters.h"
#include "parallel/parallel_dims.h"

namespace trident {

// Which of its tensors a rank writes: one copy of each, from the first rank of the set
// holding it replicated (model/placement.h): of its data axes' group, and of the tp ranks
// holding its piece, the one whose copy counts.
class CheckpointWriter {
 public:
  CheckpointWriter(const ParallelDims& dims, const RankCoords& coords) : dims_(dims), coords_(coords) {}
  bool writes(const Placement& p) const;

 private:
  ParallelDims dims_;
  RankCoords coords_;
  mutable std::map<AxisSet, bool> first_of_;  // by data axes: whether this rank is its group's first
};

// One kind of this rank's state as a full flat buffer in host memory.
struct KindSource {
  std::string kind;
  const float* flat = nullptr;  // null: for sizes only
};

// What a checkpoint holds of each tensor, in this order in the node files: the
// parameters, then the optimizer's state buffers (optim/optimizer.h). The model's declared
// buffers (StateKind::buffer) follow as the kind kBuffers, of their own tensors.
std::vector<std::string> checkpoint_kinds(const std::vector<std::string>& optimizer_state);
inline constexpr const char* kBuffers = "buffers";

// The pieces of this rank's state that go into its node's file: its stage's tensors,
// its tp shard, of every kind in `sources`' order. One replica writes for all
// (CheckpointWriter), and of the tp ranks holding the same piece, the one whose copy counts.
std::vector<Piece> rank_pieces(const ParameterLayout& layout, const CheckpointWriter& writer,
                               const std::vector<KindSource>& sources);
// The same of these tensors (layout.buffers(), over their own flat buffer).
std::vector<Piece> rank_pieces(const std::vector<ParameterTensor>& tensors, const CheckpointWriter& writer,
                               const std::vector<KindSource>& sources);

// Which of a checkpoint's node files a rank of `layout` reads to load it: the ones
// holding its own shards, else every one holding a shard of a tensor it reshards.
std::vector<bool> files_needed(const Manifest& m, const ParameterLayout& layout);

// This rank's state of every kind in `kinds` (checkpoint_kinds' order) read from a
// checkpoint saved under any layout: full flat buffers of `layout` holding its tensors.
std::vector<std::vector<float>> read_rank_state(const Manifest& m, const ParameterLayout& layout,
                                                const std::vector<std::string>& kinds);
// This rank's buffers (layout.buffers()) read from a checkpoint saved under any layout,
// into `flat` (buffer_floats(), their init on entry): those the checkpoint lacks (saved
// before they were declared) keep their init, and are named in the answer.
std::vector<std::string> read_rank_buffers(const Manifest& m, const ParameterLayout& layout, float* flat);

}  // namespace trident
