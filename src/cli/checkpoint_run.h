// A trained model loaded for the commands that put it to use (eval, generate): the
// model and the tokenizer come from the checkpoint's stored config (checkpoint.load,
// else checkpoint.dir's newest complete step), flags win; the layout is this run's own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_state.h"
#include "train/setup.h"

namespace trident {

// A run on a checkpoint: its config, the grid, the model with the checkpoint loaded.
struct CheckpointRun {
  Config config;
  std::unique_ptr<ParallelState> parallel;
  std::unique_ptr<kernels::Kernels> k;
  std::unique_ptr<TrainingSetup> setup;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string checkpoint;
  int step = 0;
};

// The checkpoint found (by rank 0, told to all) and the config resolved for the world,
// one sequence per forward on each dp rank. No grid yet, so bad input is a UsageError
// that every rank raises alike. Collective.
CheckpointRun open_checkpoint_run(const std::string& command, const std::vector<std::string>& args,
                                  const MpiWorld& world);

// After open_checkpoint_run, once communication may start: the grid, the model with the
// checkpoint's parameters, and the tokenizer. Collective.
void load_checkpoint_run(CheckpointRun& run);

}  // namespace trident
