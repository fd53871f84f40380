// What this rank's pipeline stage holds and runs, from the config and the grid.
#pragma once

#include "config/config.h"
#include "model/parameters.h"
#include "parallel/parallel_state.h"
#include "pipeline/pipeline_links.h"
#include "pipeline/schedule.h"

namespace trident {

struct PipelinePlan {
  StageSpec stage;
  Schedule schedule = Schedule::one_f_one_b;
  int micro_batches = 1;  // per step, on this dp rank
  int chunks = 1;         // model chunks per rank (parallel.vpp)
  int slots = 1;          // activation sets the schedule keeps alive on this stage
  PipelineLinks links;
};

inline PipelinePlan plan_pipeline(const Config& config, ParallelState& parallel, int local_batch, int micro_batch) {
  PipelinePlan plan;
  const int stage = parallel.coord(Axis::pp), stages = parallel.size(Axis::pp);
  plan.chunks = config.parallel.vpp;
  plan.stage = stage_spec(config.model.n_layer, stage, stages, config.parallel.pp_layers, plan.chunks);
  plan.schedule = config.parallel.schedule;
  plan.micro_batches = local_batch / micro_batch;
  plan.slots = max_in_flight(plan.schedule, stage, stages, plan.micro_batches, plan.chunks);
  plan.links = {&parallel.pp(), parallel.embedding(), plan.schedule};
  return plan;
}

}  // namespace trident
