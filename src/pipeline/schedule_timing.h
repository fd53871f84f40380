// A schedule played out on all stages with given pass times, as the pipeline runner
// executes it (pipeline/pipeline_runner.h): a forward starts when its slot's last
// outputs have been received and its input has arrived (blocking receive); a backward
// starts when its gradient has arrived, and sends its own (from a copy) once its last
// one has been received; a send is received when the receiving pass starts, and takes
// no time. Pure: for the schedules' tests
// (closed-form bubbles, no deadlock, transfers in the same order on both sides) and the
// bubble benchmark's theory column.
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace trident {

// One micro-batch's pass times on one stage (all of its chunks together). `backward` is
// input + weight: a whole backward takes both, zb1's halves one each.
struct PassTimes {
  double forward = 0, input_gradient = 0, weight_gradient = 0;
  double total() const { return forward + input_gradient + weight_gradient; }
};

struct ScheduleTiming {
  bool completes = false;     // false: the stages wait on each other for ever
  std::string stuck;          // then where (stage and action)
  double step = 0;            // until the last stage is done
  std::vector<double> busy;   // per stage: time computing
  double bubble(int stage) const { return step - busy[stage]; }
  // Per pair of stages (from, to) and direction, whether the tags were sent and received
  // in one order (the runner's receives are blocking and in schedule order).
  bool transfers_in_order = true;
};

ScheduleTiming play_schedule(Schedule schedule, int stages, int micro_batches, int chunks, const PassTimes& times);

}  // namespace trident
