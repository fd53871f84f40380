#pragma once

#include <string>
#include <vector>

#include "parallel/mpi_world.h"

namespace trident {

// `trident doctor [--config FILE] [--checkpoint.dir=DIR] [--device=cuda] [--expect_busbw GB/s]`:
// the preflight an admin runs before a long job (every rank; collective). Prints one
// table on rank 0. Returns 0 when every check passed or was skipped (what the machine
// does not have), 1 when one failed (named on the last line).
int run_doctor_command(const std::vector<std::string>& args, const MpiWorld& world);

}  // namespace trident
