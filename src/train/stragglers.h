// Stragglers: in synchronous training every rank's step lasts as long as the slowest's,
// so the step time cannot show which rank holds the others up. What each rank did itself
// (reading its data, its forward and backward passes, its update; not its waiting on the
// others' collectives) can: gathered at rank 0 at each log step, the rank whose work took
// longest against the median of the ranks of its pipeline stage (stages do different work).
#pragma once

#include <string>

#include "parallel/parallel_state.h"

namespace trident {

struct Straggler {
  bool found = false;   // some rank's work took at least `factor` times its stage's median
  int rank = -1;
  RankCoords coords;
  double work_s = 0, median_s = 0;
  int stage_ranks = 0;
  std::string describe(int step) const;  // the line rank 0 prints
};

// Collective over the world; the answer on rank 0 (found = false elsewhere).
Straggler find_straggler(ParallelState& parallel, double work_s, double factor);

}  // namespace trident
