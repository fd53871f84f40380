// `trident train`: the training loop. It ties data, model, optimizer and logging
// together; everything it calls can be read and tested alone.
#pragma once

#include "config/config.h"
#include "dist/mpi_world.h"

namespace trident {

struct TrainResult {
  double first_loss = 0, last_loss = 0, val_loss = 0, unigram_entropy = 0;
  double tokens_per_s = 0, mfu = 0;
};

// Trains under a config whose layout is resolved (Config::resolve_layout).
TrainResult train(const Config& config, const MpiWorld& world);

}  // namespace trident
