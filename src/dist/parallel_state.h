// The communicators of this rank: one per axis of the rank grid (tp, dp, pp), the node
// (ranks sharing a machine, or `ranks_per_node` consecutive ranks when set, so that one
// machine can stand in for several nodes), and the world. Passed to whatever needs to
// communicate, never reached through globals.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/mpi_communicator.h"
#include "dist/parallel_dims.h"

namespace trident {

class ParallelState {
 public:
  ParallelState(const ParallelDims& dims, int ranks_per_node, double timeout_s);

  const ParallelDims& dims() const { return dims_; }
  const RankCoords& coords() const { return coords_; }
  int rank() const { return world_->rank(); }
  bool is_root() const { return rank() == 0; }

  Communicator& world() { return *world_; }
  Communicator& tp() { return *tp_; }
  Communicator& dp() { return *dp_; }
  Communicator& pp() { return *pp_; }
  Communicator& node() { return *node_; }
  // The first and last pipeline stage of this rank's (dp, tp) column, which both hold
  // the tied embedding; null on other stages and when pp == 1.
  Communicator* embedding() { return embedding_.get(); }
  int nodes() const { return nodes_; }

  // The step that a timeout message names.
  void set_step(int step) { watchdog_->step = step; }
  // The grid and the nodes, as rank 0 prints them at start.
  std::string describe() const;

 private:
  ParallelDims dims_;
  RankCoords coords_;
  std::shared_ptr<Watchdog> watchdog_;
  std::unique_ptr<MpiCommunicator> world_, tp_, dp_, pp_, node_, embedding_;
  int nodes_ = 1;
};

}  // namespace trident
