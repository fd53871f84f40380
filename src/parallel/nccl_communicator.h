// The NCCL backend of the communicator layer (device memory; built when NCCL is found).
#pragma once

#include <memory>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace trident {

bool nccl_compiled_in();

// An NCCL communicator over the ranks of `group` (its MPI communicator broadcasts the
// unique id and stays for the host-side checks), on the current CUDA device. Collectives
// run on a dedicated stream, ordered after the work already issued to the compute
// stream; waits are bounded by the watchdog like the MPI backend's. point_to_point:
// the group also sends and receives (the pipeline), which takes two more communicators.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group,
                                                     std::shared_ptr<Watchdog> watchdog, bool point_to_point = false);

}  // namespace trident
