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
                rank, coords[Axis::dp], coords[Axis::tp], coords[Axis::pp], work_s, step, work_s / median_s, median_s,
                stage_ranks);
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
  std::vector<std::vector<int>> stages(d.size(Axis::pp));  // the ranks of each pipeline stage
  for (int rank = 0; rank < d.world(); rank++) stages[d.coords(rank)[Axis::pp]].push_back(rank);
  double worst = 0;
  for (const std::vector<int>& ranks : stages) {
    std::vector<double> sorted;
    for (int rank : ranks) sorted.push_back(work[rank]);
    // The lower median: of two ranks, the faster one (else a slow one of two is its own median).
    const size_t middle = (sorted.size() - 1) / 2;
    std::nth_element(sorted.begin(), sorted.begin() + middle, sorted.end());
    const double median = sorted[middle];
    if (median <= 0) continue;
    for (int rank : ranks) {
      const double ratio = work[rank] / median;
      if (ratio < factor || ratio <= worst) continue;
      worst = ratio;
      s.found = true;
      s.rank = rank;
      s.coords = d.coords(rank);
      s.work_s = work[rank];
      s.median_s = median;
      s.stage_ranks = static_cast<int>(ranks.size());
    }
  }
  return s;
}

}  // namespace trident
