// Silent data corruption: ranks that must hold bitwise equal parameters are compared
// every train.replica_check_steps steps. Each rank hashes (CRC-32) what it holds that its
// replicas hold too: all of its parameters across the dp group under ZeRO 0-2 (the
// forward's copy is whole on every dp rank), its pieces across the replicas under hybrid
// sharding with ZeRO-3, and the tensors tensor parallelism keeps whole (norms, biases,
// position embeddings) across the tp group; the tensors of the layout's regions (those
// held by other ranks than dp's: model/parameters.h data_regions, an ep shard's) across the
// ranks holding them, as their placements say. Rank 0 compares the hashes of each group; a
// rank that differs from its group's majority is named (Megatron-LM's weight-hash check
// across replicas).
#pragma once

#include <string>
#include <vector>

#include "model/parameters.h"
#include "parallel/parallel_state.h"

namespace trident {

struct ReplicaComparison {
  bool agree = true;
  std::vector<int> odd_ranks;  // world ranks that differ from their group's majority (both of a tie)
  bool tie = false;            // some group had no majority
  std::string report;          // on rank 0: which ranks, which group, against whom
};

class ReplicaCheck {
 public:
  // `replicas`: the group whose members hold the same parameters (dp, or hybrid
  // sharding's replica group under ZeRO-3), null when none does (ZeRO-3 without hybrid
  // sharding); the tp group is compared on the tensors it keeps whole; the layout's regions
  // across their groups.
  ReplicaCheck(ParallelState& parallel, const ParameterLayout& layout, Communicator* replicas, bool compare_tp,
               int every_steps);
  bool enabled() const { return every_ > 0 && comparable_; }
  bool due(int step) const { return enabled() && (step + 1) % every_ == 0; }
  // What is compared, for the startup lines ("" when nothing is).
  std::string describe() const;
  // Collective over the world; the verdict on every rank, the report on rank 0. `buffers`:
  // the layout's declared buffers (buffer_floats(), host memory), each compared across the
  // group of its data axes (and over tp where tp keeps it whole).
  ReplicaComparison compare(const ShardedParameters& params, int step, const float* buffers = nullptr);

 private:
  ParallelState& parallel_;
  Communicator* replicas_;
  bool compare_tp_;
  // The regions' groups of more than one rank, by the regions' data axes.
  std::vector<std::pair<AxisSet, Communicator*>> regions_;
  // The buffers' groups of more than one rank, by their data axes.
  std::vector<std::pair<AxisSet, Communicator*>> buffer_groups_;
  bool has_regions_;
  bool comparable_;
  int every_;
};

}  // namespace trident
