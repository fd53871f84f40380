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
  // The groups every run uses, in one order on every rank (a first use is collective).
  for (Axis axis : kAxes) group(axis);
  group({MeshAxis::dp, MeshAxis::cp});
  group({MeshAxis::ep});
  group({MeshAxis::edp});
  group({MeshAxis::pp_ends});
}

Communicator& ParallelState::group(AxisSet axes) {
  const AxisSet set = dims_.normalized(axes);
  auto& made = groups_[set];
  if (made) return *made;
  const std::vector<int> ranks = dims_.group_ranks(coords_, set);
  // Ranks of one group name it by its first rank; off the end stages a pp ends group is
  // no group (MPI_UNDEFINED, collective still) and this rank stands alone.
  MPI_Comm comm = split(ranks.empty() ? MPI_UNDEFINED : ranks.front(), rank());
  if (comm == MPI_COMM_NULL) check(MPI_Comm_dup(MPI_COMM_SELF, &comm) == MPI_SUCCESS, "MPI_Comm_dup");
  made = make_group(comm, set.name());
  return *made;
}

std::unique_ptr<Communicator> ParallelState::make_group(MPI_Comm comm, const std::string& name) {
  auto mpi = std::make_unique<MpiCommunicator>(comm, name, watchdog_);
  if (!cuda_ || mpi->size() == 1) return mpi;  // one rank: every collective is the identity, no NCCL needed
  return make_nccl_communicator(std::move(mpi), watchdog_, /*point_to_point=*/name == "pp" || name == "cp");
}

std::string ParallelState::describe() const {
  std::ostringstream s;
  s << dims_.describe() << "\n  nodes: " << nodes_ << " (" << node_->size() << " ranks on rank 0's node)";
  return s.str();
}

}  // namespace trident
