#pragma once

#include <string>
#include <vector>

#include "parallel/mpi_world.h"

namespace trident {

// `trident eval --checkpoint.dir=DIR | --checkpoint.load=STEP_DIR [--split val|train]
// [--max_sequences N]`: the checkpoint's mean loss per token and perplexity on a split
// of the data (train/inference.h), the same under every layout. Every rank (collective);
// rank 0 prints one line. Returns the exit code.
int run_eval_command(const std::vector<std::string>& args, const MpiWorld& world);

}  // namespace trident
