// The MPI world of this process: initialized once in main, finalized on exit. The
// rank grid and communicators of the parallel layouts build on it.
#pragma once

#include <string>

namespace trident {

// Picks Open MPI's Rabenseifner algorithm for non-blocking all-reduce (unless the user
// chose one): libnbc's default ran at half the speed of the blocking MPI_Allreduce here,
// Rabenseifner matches it (benchmarks/RESULTS.md). Call before MPI_Init.
void tune_mpi_before_init();

class MpiWorld {
 public:
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  std::string library_version() const;

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace trident
