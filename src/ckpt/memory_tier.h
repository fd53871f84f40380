// The memory tier (checkpoint.memory_every_steps): a checkpoint in node memory, taken far
// more often than the disk's, so that a run restarted on the same nodes loses a few steps,
// not everything since the last disk checkpoint (Megatron's local checkpoints, HyperPod's
// checkpointless recovery). Every N steps each rank copies what it holds of the training
// state (its view of the parameters, the optimizer's state and the buffers: the same flat
// host buffers as a disk checkpoint, without gathering anything) into a file in POSIX shared
// memory, /dev/shm/trident-<key>-r<rank>-s<step>, with a CRC-32. A snapshot is complete when
// every rank has written its own (one all-reduce after the writes; a restart takes the
// newest step every rank holds intact). Two are kept; a run that ends complete removes them.
//
// <key> names the checkpoint folder and the layout (the mesh's sizes, ZeRO): a process
// restarted under the same layout finds them, another layout or another folder never reads
// them (it reshards from disk). A snapshot a rank cannot write (/dev/shm full) is a warning
// once, and the run goes on with the disk tier alone. A copy on a partner node, for a node
// that is replaced, is the next step (issue 57).
#pragma once

#include <string>
#include <vector>

#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "parallel/parallel_state.h"

namespace trident {

class MemoryTier {
 public:
  // `data`: the training data's fingerprint (a snapshot of other data is not this run's);
  // `folder`: the snapshots' directory.
  MemoryTier(const Config& config, ParallelState& parallel, ShardedState state, const std::string& data,
             std::string folder = "/dev/shm");

  bool enabled() const { return every_ > 0 && !disabled_; }
  bool due(int step) const { return enabled() && (step + 1) % every_ == 0; }
  // Collective: this rank's state after `step` into node memory; complete once every rank's
  // is. Returns the seconds it blocked.
  double save(int step);
  // Collective: the newest step every rank holds a complete, intact snapshot of (-1: none).
  int newest_complete();
  // Collective: this rank's state from the snapshot of `step` (newest_complete's); false on
  // every rank where any rank's copy is damaged (a CRC-32 that does not match): the disk's then.
  bool load(int step);
  // The run ended complete: its snapshots are no longer needed.
  void remove_all();
  // Rank `rank`'s snapshot file of `step` (tests: what a lost node loses).
  std::string rank_file(int step, int rank) const;

 private:
  std::vector<int> steps_held() const;  // this rank's snapshot steps, ascending
  const Config& config_;
  ParallelState& parallel_;
  ShardedState state_;
  std::string folder_, key_;
  int every_ = 0;
  bool disabled_ = false;
};

}  // namespace trident
