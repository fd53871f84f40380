// What a config becomes on a world of N ranks, before anything is built: dp and the
// micro-batch filled in, and every check that needs the model's family or the pipeline.
// Train, verify, the tests and the planners (memory plan, `trident plan`, doctor) all
// resolve a config here, so each judges the same layout.
#pragma once

#include "config/config.h"
#include "model/transformer.h"
#include "parallel/parallel_dims.h"

namespace trident {

// Completes a parsed config for `world_size` ranks (dp, micro_batch) and makes every
// check that needs the model's family or the pipeline: the family's own rules, tp
// against heads, key/value heads and the MLP width, the stage split, the schedule.
// UsageError naming the keys; before any communication, so every rank agrees.
void resolve_for_world(Config& config, int world_size);

// The ZeRO stage that applies: parallel.zero, or 0 with one dp rank (nothing to shard).
int zero_stage(const Config& config, const ParallelDims& dims);

// One rank's model stage as the run builds it, from the (resolved) config and the rank's
// place in the grid: what TrainingSetup hands the model (train/setup.h) and what the
// memory plan measures (plan/memory_plan.h), derived here once.
struct RankStage {
  StageSpec stage;             // its layers (the pipeline's split, pipeline/schedule.h)
  int tp_rank = 0, tp = 1, cp = 1;
  size_t buffer_multiple = 1;  // dp x cp: ZeRO cuts the flat buffers into equal blocks
  int micro_batch = 1;
  int slots = 1;               // the activation sets its schedule keeps alive (per (micro-batch, chunk))
  std::vector<int> chunk_slots;  // interleaved: per chunk, its own (the embedding's, head's)
  Recompute recompute = Recompute::none;
  int recompute_layers = 0;  // full: per chunk (0: all; model/activations.h)
  RecomputeMethod recompute_method = RecomputeMethod::block;
  bool sequence_parallel = false;  // tp > 1 and parallel.sequence_parallel
  bool split_backward = false;     // zb1's deferred weight gradients
  int zero = 0;                    // the ZeRO stage that applies

  ParameterLayout layout(const TransformerSpec& spec) const;
  ActivationShape activations(const TransformerSpec& spec, const kernels::Footprint& k) const;
};
// dims: the run's grid (config.dims() of a resolved config, or the ranks' own).
RankStage rank_stage(const Config& config, const ParallelDims& dims, const RankCoords& coords);

}  // namespace trident
