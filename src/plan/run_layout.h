// What a config becomes on a world of N ranks, before anything is built: dp and the
// micro-batch filled in, and every check that needs the model's family or the pipeline.
// Train, verify, the tests and the planners (memory plan, `trident plan`, doctor) all
// resolve a config here, so each judges the same layout.
#pragma once

#include "config/config.h"
#include "parallel/parallel_dims.h"

namespace trident {

// Completes a parsed config for `world_size` ranks (dp, micro_batch) and makes every
// check that needs the model's family or the pipeline: the family's own rules, tp
// against heads, key/value heads and the MLP width, the stage split, the schedule.
// UsageError naming the keys; before any communication, so every rank agrees.
void resolve_for_world(Config& config, int world_size);

// The ZeRO stage that applies: parallel.zero, or 0 with one dp rank (nothing to shard).
int zero_stage(const Config& config, const ParallelDims& dims);

}  // namespace trident
