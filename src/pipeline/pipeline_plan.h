// What this rank's pipeline stage runs, from the config and the grid (what it holds:
// plan/run_layout.h's RankStage).
#pragma once

#include "config/config.h"
#include "model/parameters.h"
#include "parallel/parallel_state.h"
#include "pipeline/pipeline_links.h"
#include "pipeline/schedule.h"

namespace trident {

struct PipelinePlan {
  Schedule schedule = Schedule::one_f_one_b;
  int micro_batches = 1;  // per step, on this dp rank
  int chunks = 1;         // model chunks per rank (parallel.vpp)
  PipelineLinks links;
};

inline PipelinePlan plan_pipeline(const Config& config, ParallelState& parallel, int local_batch, int micro_batch) {
  PipelinePlan plan;
  plan.chunks = config.parallel.vpp;
  plan.schedule = config.parallel.schedule;
  plan.micro_batches = local_batch / micro_batch;
  plan.links = {&parallel.pp(), plan.schedule};
  return plan;
}

}  // namespace trident
