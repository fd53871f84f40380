// How this rank's pipeline stage reaches the others.
#pragma once

#include "config/choices.h"
#include "parallel/communicator.h"

namespace trident {

struct PipelineLinks {
  Communicator* pp = nullptr;         // the pipeline group, stage = pp->rank(); null: one stage
  Schedule schedule = Schedule::one_f_one_b;
};

}  // namespace trident
