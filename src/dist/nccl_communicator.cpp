#include "dist/nccl_communicator.h"

#include "runtime/error.h"

#ifndef TRIDENT_NCCL
namespace trident {

bool nccl_compiled_in() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group,
                                                     std::shared_ptr<Watchdog>) {
  throw UsageError("the " + group->name() +
                   " group needs NCCL, which this build lacks (rebuild with NCCL_HOME=/path/to/nccl)");
}

}  // namespace trident
#endif
