#pragma once

#include "parallel/mpi_world.h"

namespace trident {

// `trident --version`: what this build was made with (compiler, MPI, HDF5, BLAS, Boost,
// and the CUDA and NCCL it was built against, or "not built"), for a bug report or a
// benchmark's record. Prints on the calling rank.
void print_version(const MpiWorld& world);

}  // namespace trident
