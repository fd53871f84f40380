#pragma once

#include <string>
#include <vector>

namespace trident {

// `trident ckpt ls|inspect|export --checkpoint.dir=DIR [--step=N] [--out=FILE.h5]`.
// Runs on rank 0 alone; returns the exit code.
int run_ckpt_command(const std::vector<std::string>& args);

}  // namespace trident
