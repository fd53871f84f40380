// The communicators of this rank: one per axis of the rank grid (tp, dp, pp, ...), the node
// (ranks sharing a machine, or `ranks_per_node` consecutive ranks when set, so that one
// machine can stand in for several nodes), and the world. Passed to whatever needs to
// communicate, never reached through globals.
// With device "cuda" each rank first takes the GPU of its node rank, and the tp, dp, pp
// and embedding groups move device memory through NCCL (communicators made from the
// MPI groups); the world and node groups stay on MPI: they carry host data only.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "kernels/dtype.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallel_dims.h"

namespace trident {

class ParallelState {
 public:
  ParallelState(const ParallelDims& dims, int ranks_per_node, double timeout_s, kernels::Device device = kernels::Device::cpu);

  const ParallelDims& dims() const { return dims_; }
  const RankCoords& coords() const { return coords_; }
  int rank() const { return world_->rank(); }
  bool is_root() const { return rank() == 0; }

  // This rank's size and place along one axis of the grid.
  int size(Axis a) const { return dims_.size(a); }
  int coord(Axis a) const { return coords_[a]; }

  Communicator& world() { return *world_; }
  // The ranks that differ from this one only along `axis`.
  Communicator& group(Axis axis) { return *groups_[static_cast<int>(axis)]; }
  Communicator& tp() { return group(Axis::tp); }
  Communicator& dp() { return group(Axis::dp); }
  Communicator& pp() { return group(Axis::pp); }
  Communicator& cp() { return group(Axis::cp); }
  // The ranks that hold the same parameters (ParallelDims::data_parallel_size: dp x cp);
  // the dp group itself when cp == 1.
  Communicator& data_parallel() { return data_parallel_ ? *data_parallel_ : dp(); }
  int data_parallel_size() const { return dims_.data_parallel_size(); }
  int data_parallel_rank() const { return dims_.data_parallel_rank(coords_); }
  // Expert parallelism (ParallelDims::set_expert_parallel): the ep ranks that exchange
  // tokens and hold the other experts (null when ep is 1), and the ranks holding the same
  // experts, over which their gradients are summed (the data-parallel group when ep is 1).
  Communicator* expert_parallel() { return expert_parallel_.get(); }
  Communicator& expert_data_parallel() { return expert_data_parallel_ ? *expert_data_parallel_ : data_parallel(); }
  Communicator& node() { return *node_; }
  // The first and last pipeline stage of this rank's (dp, tp) column, which both hold
  // the tied embedding; null on other stages and when pp == 1.
  Communicator* embedding() { return embedding_.get(); }
  int nodes() const { return nodes_; }
  // The ranks on this rank's machine (the real one, whatever ranks_per_node says).
  int ranks_on_machine() const { return ranks_on_machine_; }
  // The first rank of its machine (what a machine reports about itself comes from it).
  bool machine_leader() const { return machine_rank_ == 0; }

  // Consecutive blocks of `size` ranks of this rank's tp group, as a group of their own
  // (e.g. the ranks that hold the same key/value head). Collective over the world.
  std::unique_ptr<Communicator> split_tp(int size, const std::string& name);
  // Hybrid sharding over dp (parallel.shard_size): the block of `size` consecutive dp
  // ranks holding this rank (consecutive: true), or the dp ranks at this rank's place in
  // every block (false). Collective over the world.
  std::unique_ptr<Communicator> split_dp(int size, bool consecutive, const std::string& name);

  // The step that a timeout message names.
  void set_step(int step) { watchdog_->step = step; }
  // The bound on every blocking wait (parallel.timeout_s), to lift while some ranks do a
  // long piece of local work that the others wait for in a collective (a data copy).
  double wait_bound_s() const { return watchdog_->timeout_s; }
  void set_wait_bound_s(double seconds) { watchdog_->timeout_s = seconds; }
  // The grid and the nodes, as rank 0 prints them at start.
  std::string describe() const;

 private:
  ParallelDims dims_;
  RankCoords coords_;
  std::shared_ptr<Watchdog> watchdog_;
  std::unique_ptr<MpiCommunicator> world_, node_;
  std::unique_ptr<Communicator> make_group(MPI_Comm comm, const std::string& name);

  std::array<std::unique_ptr<Communicator>, kAxisCount> groups_;
  std::unique_ptr<Communicator> embedding_, data_parallel_, expert_parallel_, expert_data_parallel_;
  int nodes_ = 1, ranks_on_machine_ = 1, machine_rank_ = 0;
  bool cuda_ = false;
};

}  // namespace trident
