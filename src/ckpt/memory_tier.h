// The memory tier (checkpoint.memory_every_steps): a checkpoint in node memory, taken far
// more often than the disk's, so that a run restarted inside its allocation loses a few
// steps, not everything since the last disk checkpoint (Megatron's local checkpoints with
// replication, HyperPod's checkpointless recovery).
//
// Every N steps each rank copies what it holds of the training state (its view of the
// parameters, the optimizer's state and the buffers: the same flat host buffers as a disk
// checkpoint, without gathering anything) into a file in POSIX shared memory with a CRC-32C:
//   /dev/shm/trident-<key>-<node>-r<rank>-s<step>
// That is the only part training waits for. The same bytes then go, in the background (a
// non-blocking MPI send that the next step's collectives carry along), to the partner
// node, which keeps them under its own name: node i keeps node i-1's ranks' copies
// (the node names in the order of their first rank; rank j of a node sends to rank j of
// the next). They are complete by the end of the next step. Two snapshots are kept per
// node and rank; a run that ends complete removes them.
//
// A restart finds, by one catalogue over every node, the newest step for which every
// rank's piece is somewhere in node memory: on its own node (a restart on the same
// nodes), else on another (a replaced node has nothing of its own: the partner holds its
// ranks' copies and sends them). A copy whose CRC-32C does not match is not used.
//
// <key> names the checkpoint folder and the layout (the mesh's sizes, ZeRO, the data): a
// run under another layout or with another folder never reads them (it reshards from
// disk). <node> is the node's name (health/health_verdict.h's node_name()). A node without
// room for three snapshots of its ranks and their partner copies, or a write that fails,
// is one warning, and the run goes on with the disk tier alone.
#pragma once

#include <string>
#include <vector>

#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "parallel/communicator.h"
#include "parallel/parallel_state.h"

namespace trident {

// Where a restart found its state in node memory.
struct MemoryRestore {
  int step = -1;              // -1: nothing usable newer than asked for
  std::string report;         // on rank 0: where the pieces came from, and how long each took
};

class MemoryTier {
 public:
  // `data`: the training data's fingerprint (a snapshot of other data is not this run's).
  // The snapshots' folder is checkpoint.memory_dir.
  MemoryTier(const Config& config, ParallelState& parallel, ShardedState state, const std::string& data);
  ~MemoryTier();
  bool enabled() const { return every_ > 0 && !disabled_; }
  bool due(int step) const { return enabled() && (step + 1) % every_ == 0; }
  // Bytes of node memory the tier takes on this rank's node at most (the memory plan's line).
  double node_bytes() const { return node_bytes_; }
  // Collective: this rank's state after `step` into its node's memory, then its copy on the
  // way to the partner node. Returns the seconds it blocked.
  double save(int step);
  // After every step: the partner copies started at an earlier step are finished (a
  // moment's wait at most, the transfer having run beside the step) and kept. Returns the
  // seconds it blocked.
  double after_step(int step);
  // Collective: the newest step after `newer_than` whose every piece is intact in some
  // node's memory, loaded into this rank's state; step -1 on every rank otherwise.
  MemoryRestore restore(int newer_than);
  // The run ended complete: its snapshots are no longer needed.
  void remove_all();
  // The file of `rank`'s state after `step` kept in node `node`'s memory (tests: what a
  // lost node loses).
  std::string file(const std::string& node, int rank, int step) const;
  const std::string& node() const { return node_; }

 private:
  struct Held {
    int rank;
    int step;
  };
  std::vector<Held> held_here() const;       // the copies in this node's memory
  std::vector<int> steps_held(int rank) const;  // the steps of `rank` among them, ascending
  void snapshot(int step, std::vector<std::byte>& bytes);  // this rank's state as a snapshot file's bytes
  std::string tmp_file(int rank) const;  // this node's file of `rank` being written
  std::string recycled(int rank);        // the same, holding the pages of the oldest snapshot kept
  void keep_newest_two(int rank);
  void finish_partner_copy();

  const Config& config_;
  ParallelState& parallel_;
  ShardedState state_;
  std::string folder_, key_, node_;
  int every_ = 0;
  bool disabled_ = false;
  double node_bytes_ = 0;
  std::vector<std::string> node_of_;   // each rank's node name
  std::vector<size_t> bytes_of_;       // each rank's snapshot size
  int partner_ = -1;                   // where this rank's copies go (-1: a single node)
  std::vector<int> partner_of_;        // the ranks whose copies come here
  // This rank's snapshot (kept for the partner copy until it is sent) and the partner
  // copies coming here: allocated once.
  std::vector<std::byte> outgoing_;
  std::vector<std::vector<std::byte>> incoming_;
  int sending_step_ = -1;  // the partner copy in flight
  std::vector<RequestPtr> transfers_;
};

}  // namespace trident
