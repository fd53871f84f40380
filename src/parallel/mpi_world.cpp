#include "parallel/mpi_world.h"

#include <mpi.h>

#include <cstdlib>

#include "parallel/progress_board.h"

namespace trident {

void tune_mpi_before_init() {
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
}

MpiWorld::MpiWorld(int* argc, char*** argv) {
  tune_mpi_before_init();
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  progress_board::open();  // where each rank stands, for the timeout's report
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

std::string MpiWorld::library_version() const {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string v(version, length);
  return v.substr(0, v.find_first_of(",\n"));
}

}  // namespace trident
