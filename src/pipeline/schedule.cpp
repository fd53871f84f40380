#include "pipeline/schedule.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "kernels/base/error.h"

namespace trident {

std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages, int micro_batches) {
  std::vector<PipelineAction> actions;
  // One model chunk per rank: every action runs chunk 0.
  const auto forward = [&actions](int mb) { actions.push_back({PipelineAction::forward, mb, 0}); };
  const auto backward = [&actions](int mb) { actions.push_back({PipelineAction::backward, mb, 0}); };
  const int m = micro_batches;
  if (schedule == Schedule::gpipe) {
    for (int i = 0; i < m; i++) forward(i);
    for (int i = m - 1; i >= 0; i--) backward(i);
    return actions;
  }
  const int warmup = std::min(stages - stage - 1, m);
  int next_forward = 0, next_backward = 0;
  // Warmup: fill the pipeline.
  for (int i = 0; i < warmup; i++) forward(next_forward++);
  // Steady state: one forward, one backward.
  for (int i = 0; i < m - warmup; i++) {
    forward(next_forward++);
    backward(next_backward++);
  }
  // Cooldown: drain it.
  for (int i = 0; i < warmup; i++) backward(next_backward++);
  return actions;
}

int max_in_flight(Schedule schedule, int stage, int stages, int micro_batches) {
  return schedule == Schedule::gpipe ? micro_batches : std::min(stages - stage, micro_batches);
}

std::vector<int> stage_layer_counts(int n_layer, int stages, const std::string& explicit_counts) {
  require(stages <= n_layer, "parallel.pp (" + std::to_string(stages) + ") exceeds model.n_layer (" +
                                 std::to_string(n_layer) + "): every stage needs a layer");
  std::vector<int> counts;
  if (explicit_counts.empty()) {
    for (int s = 0; s < stages; s++) counts.push_back(n_layer / stages + (s < n_layer % stages ? 1 : 0));
    return counts;
  }
  std::stringstream in(explicit_counts);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      counts.push_back(std::stoi(item, &used));
      require(used == item.size(), "");
    } catch (const std::exception&) {
      throw UsageError("parallel.pp_layers must be a list of layer counts like 3,3,2, got '" + explicit_counts + "'");
    }
    require(counts.back() > 0, "parallel.pp_layers: every stage needs at least one layer");
  }
  require(static_cast<int>(counts.size()) == stages, "parallel.pp_layers lists " + std::to_string(counts.size()) +
                                                         " stages but parallel.pp is " + std::to_string(stages));
  require(std::accumulate(counts.begin(), counts.end(), 0) == n_layer,
          "parallel.pp_layers adds up to " + std::to_string(std::accumulate(counts.begin(), counts.end(), 0)) +
              " layers but model.n_layer is " + std::to_string(n_layer));
  return counts;
}

StageSpec stage_spec(int n_layer, int stage, int stages, const std::string& pp_layers) {
  const std::vector<int> counts = stage_layer_counts(n_layer, stages, pp_layers);
  StageSpec spec;
  spec.first_layer = std::accumulate(counts.begin(), counts.begin() + stage, 0);
  spec.layers = counts[stage];
  spec.has_embedding = stage == 0;
  spec.has_head = stage == stages - 1;
  return spec;
}

}  // namespace trident
