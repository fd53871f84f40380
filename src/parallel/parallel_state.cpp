#include "parallel/parallel_state.h"

#include <sstream>

#include "parallel/nccl_communicator.h"
#include "kernels/kernels.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

MPI_Comm split(int color, int key) {
  MPI_Comm comm;
  check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm) == MPI_SUCCESS, "MPI_Comm_split");
  return comm;
}

}  // namespace

ParallelState::ParallelState(const ParallelDims& dims, int ranks_per_node, double timeout_s, kernels::Device device)
    : dims_(dims), watchdog_(std::make_shared<Watchdog>(Watchdog{timeout_s, -1})) {
  world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", watchdog_);
  check(world_->size() == dims.world(), "ParallelState: the grid does not match the world size");
  const int rank = world_->rank();
  coords_ = dims.coords(rank);
  MPI_Comm machine, node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &machine) == MPI_SUCCESS,
        "MPI_Comm_split_type");
  MPI_Comm_size(machine, &ranks_on_machine_);
  MPI_Comm_rank(machine, &machine_rank_);
  if (ranks_per_node > 0) {
    MPI_Comm_free(&machine);
    node = split(rank / ranks_per_node, rank);
  } else {
    node = machine;
  }
  node_ = std::make_unique<MpiCommunicator>(node, "node", watchdog_);
  // Count the nodes: one leader (node rank 0) each.
  nodes_ = static_cast<int>(world_->all_reduce(node_->rank() == 0 ? 1.0 : 0.0));

  cuda_ = device == kernels::Device::cuda;
  if (cuda_) {
    kernels::select_cuda_device(node_->rank());  // before any NCCL communicator exists
    require(dims.world() == 1 || nccl_compiled_in(),
            "device cuda on " + std::to_string(dims.world()) +
                " ranks needs NCCL, which this build lacks (rebuild with NCCL_HOME=/path/to/nccl)");
  }
  const auto make = [this](MPI_Comm comm, const std::string& name) { return make_group(comm, name); };
  // Ranks of one group share every other coordinate: the group's first rank is its color.
  for (Axis axis : kAxes)
    groups_[static_cast<int>(axis)] =
        make(split(dims.rank_of(coords_.with(axis, 0)), coords_[axis]), axis_name(axis));
  if (dims.size(Axis::cp) > 1)
    data_parallel_ = make(split(dims.rank_of(coords_.with(Axis::cp, 0).with(Axis::dp, 0)),
                                dims.data_parallel_rank(coords_)),
                          "dp x cp");
  if (const int ep = dims.expert_parallel_size(); ep > 1) {
    // The coordinates of data-parallel rank i (cp fastest) in this rank's (tp, pp) column.
    const auto at = [&](int i) {
      return coords_.with(Axis::cp, i % dims.size(Axis::cp)).with(Axis::dp, i / dims.size(Axis::cp));
    };
    const int i = dims.data_parallel_rank(coords_);
    expert_parallel_ = make(split(dims.rank_of(at(i / ep * ep)), i % ep), "ep");
    expert_data_parallel_ = make(split(dims.rank_of(at(i % ep)), i / ep), "expert dp");
  }
  // Every rank takes part in the split; those of neither end stage get no communicator.
  const int stages = dims.size(Axis::pp), stage = coords_[Axis::pp];
  const bool end_stage = stages > 1 && (stage == 0 || stage == stages - 1);
  MPI_Comm embedding = split(end_stage ? dims.rank_of(coords_.with(Axis::pp, 0)) : MPI_UNDEFINED, stage);
  if (end_stage) embedding_ = make(embedding, "embedding");
}

std::unique_ptr<Communicator> ParallelState::make_group(MPI_Comm comm, const std::string& name) {
  auto mpi = std::make_unique<MpiCommunicator>(comm, name, watchdog_);
  if (!cuda_ || mpi->size() == 1) return mpi;  // one rank: every collective is the identity, no NCCL needed
  return make_nccl_communicator(std::move(mpi), watchdog_, /*point_to_point=*/name == "pp" || name == "cp");
}

std::unique_ptr<Communicator> ParallelState::split_tp(int size, const std::string& name) {
  check(size > 0 && dims_.size(Axis::tp) % size == 0, "split_tp: the block size must divide tp");
  const int tp_rank = coords_[Axis::tp];
  return make_group(split(dims_.rank_of(coords_.with(Axis::tp, tp_rank / size * size)), tp_rank), name);
}

std::unique_ptr<Communicator> ParallelState::split_dp(int size, bool consecutive, const std::string& name) {
  check(size > 0 && dims_.size(Axis::dp) % size == 0, "split_dp: the block size must divide dp");
  const int dp_rank = coords_[Axis::dp];
  const int first = consecutive ? dp_rank / size * size : dp_rank % size;
  return make_group(split(dims_.rank_of(coords_.with(Axis::dp, first)), dp_rank), name);
}

std::string ParallelState::describe() const {
  std::ostringstream s;
  s << dims_.describe() << "\n  nodes: " << nodes_ << " (" << node_->size() << " ranks on rank 0's node)";
  return s.str();
}

}  // namespace trident
