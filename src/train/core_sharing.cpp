#include "train/core_sharing.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>

namespace trident {

std::string CoreSharing::advice() const {
  char text[512];
  if (threads_oversubscribe()) {
    std::snprintf(text, sizeof text,
                  "warning: %d ranks x %d OpenMP threads = %d threads on this machine's %d cores: the ranks take turns "
                  "and every step slows down many times over; give each rank %d thread(s): mpirun -x "
                  "OMP_NUM_THREADS=%d, or Slurm's --cpus-per-task",
                  ranks, threads_per_rank, threads(), cores, std::max(1, cores / ranks), std::max(1, cores / ranks));
    return text;
  }
  if (ranks_take_turns()) {
    std::snprintf(text, sizeof text,
                  "note: %d ranks share this machine's %d cores (one machine standing in for a cluster): the ranks "
                  "take turns, so stragglers are not reported",
                  ranks, cores);
    return text;
  }
  return "";
}

CoreSharing core_sharing(ParallelState& parallel) {
  // The busiest machine's: every rank must reach the same verdict (stragglers are found
  // by a collective).
  CoreSharing s;
  Communicator& world = parallel.world();
  s.ranks = static_cast<int>(world.all_reduce(static_cast<double>(parallel.ranks_on_machine()), ReduceOp::max));
  s.threads_per_rank = static_cast<int>(world.all_reduce(static_cast<double>(omp_get_max_threads()), ReduceOp::max));
  s.cores = -static_cast<int>(world.all_reduce(-static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)), ReduceOp::max));
  return s;
}

}  // namespace trident
