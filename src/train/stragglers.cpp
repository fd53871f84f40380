#include "train/stragglers.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace trident {

std::string Straggler::describe(int step) const {
  char line[256];
  std::snprintf(line, sizeof line,
                "straggler: rank %d (dp %d, tp %d, pp %d) worked %.3f s in step %d, %.2fx the median %.3f s of its "
                "stage's %d ranks",
                rank, coords.dp, coords.tp, coords.pp, work_s, step, work_s / median_s, median_s, stage_ranks);
  return line;
}

Straggler find_straggler(ParallelState& parallel, double work_s, double factor) {
  Communicator& world = parallel.world();
  std::vector<double> work(world.size(), 0.0);
  work[world.rank()] = work_s;
  world.all_reduce(std::span<double>(work));
  Straggler s;
  if (!parallel.is_root()) return s;
  const ParallelDims& d = parallel.dims();
  const int per_stage = d.dp * d.tp;  // rank = tp + tp * (dp + dp * pp): a stage is a block of ranks
  double worst = 0;
  for (int stage = 0; stage < d.pp; stage++) {
    std::vector<double> mine(work.begin() + stage * per_stage, work.begin() + (stage + 1) * per_stage);
    std::vector<double> sorted = mine;
    // The lower median: of two ranks, the faster one (else a slow one of two is its own median).
    const size_t middle = (sorted.size() - 1) / 2;
    std::nth_element(sorted.begin(), sorted.begin() + middle, sorted.end());
    const double median = sorted[middle];
    if (median <= 0) continue;
    for (int i = 0; i < per_stage; i++) {
      const double ratio = mine[i] / median;
      if (ratio < factor || ratio <= worst) continue;
      worst = ratio;
      s.found = true;
      s.rank = stage * per_stage + i;
      s.coords = {i % d.tp, i / d.tp, stage};
      s.work_s = mine[i];
      s.median_s = median;
      s.stage_ranks = per_stage;
    }
  }
  return s;
}

}  // namespace trident
