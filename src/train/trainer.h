// `trident train`: the training loop. It ties data, model, optimizer and logging
// together; everything it calls can be read and tested alone.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "parallel/parallel_state.h"

namespace trident {

struct TrainResult {
  double first_loss = 0, last_loss = 0, val_loss = 0, unigram_entropy = 0;
  // The last step's (summary.json has the means of the steady steps).
  double last_step_tokens_per_s = 0, last_step_mfu = 0;
  double comm_wait_s = 0;  // summed over steps: waiting for the data-parallel reduction
  double data_wait_s = 0;  // summed over steps: drawing the batch from the data
  double step_time_s = 0;  // summed over steps
  // The steps after the first (which warms up): their number, summed time, and summed
  // time rank 0 waited on its pipeline neighbours.
  int steady_steps = 0;
  double steady_time_s = 0, pipeline_wait_s = 0;
  double peak_gflops = 0;  // what MFU is measured against, all ranks together
  int straggler_reports = 0;  // log steps at which a rank worked log.straggler_factor x its stage's median
  uint64_t host_syncs_per_step = 0;  // this rank's most in a step after the first (kernels.h's blocking calls)
  int steps_run = 0;                 // by this run (a resumed one starts after its checkpoint)
  int replica_checks = 0;            // train.replica_check_steps: checks run, and their time (rank 0's)
  double replica_check_s = 0;
};

// Trains under a config whose layout is resolved (Config::resolve_layout), on the grid
// of `parallel`.
TrainResult train(const Config& config, ParallelState& parallel);

}  // namespace trident
