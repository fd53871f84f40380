#pragma once

#include <string>
#include <vector>

#include "parallel/mpi_world.h"

namespace trident {

// `trident generate --checkpoint.dir=DIR | --checkpoint.load=STEP_DIR --prompt TEXT
// [--max_tokens N] [--temperature T] [--top_k K] [--seed S] [--dump_logits FILE]`: the
// prompt and its continuation (train/inference.h), printed by rank 0. Every rank
// (collective) draws the same tokens. Returns the exit code.
int run_generate_command(const std::vector<std::string>& args, const MpiWorld& world);

}  // namespace trident
