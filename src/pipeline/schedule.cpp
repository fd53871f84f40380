#include "pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <sstream>

#include "kernels/base/error.h"

namespace trident {

const char* action_name(PipelineAction::Kind kind) {
  switch (kind) {
    case PipelineAction::forward: return "forward";
    case PipelineAction::backward: return "backward";
    case PipelineAction::input_gradient: return "input-gradient";
    case PipelineAction::weight_gradient: return "weight-gradient";
  }
  return "?";
}

namespace {

using Actions = std::vector<PipelineAction>;

Actions gpipe(int m) {
  Actions a;
  for (int i = 0; i < m; i++) a.push_back({PipelineAction::forward, i});
  for (int i = m - 1; i >= 0; i--) a.push_back({PipelineAction::backward, i});
  return a;
}

Actions one_f_one_b(int stage, int stages, int m) {
  Actions a;
  const int warmup = std::min(stages - stage - 1, m);
  int next_forward = 0, next_backward = 0;
  for (int i = 0; i < warmup; i++) a.push_back({PipelineAction::forward, next_forward++});  // fill
  for (int i = 0; i < m - warmup; i++) {  // steady: one forward, one backward
    a.push_back({PipelineAction::forward, next_forward++});
    a.push_back({PipelineAction::backward, next_backward++});
  }
  for (int i = 0; i < warmup; i++) a.push_back({PipelineAction::backward, next_backward++});  // drain
  return a;
}

// Megatron's forward_backward_pipelining_with_interleaving: the k-th forward of the rank
// runs micro-batch (k / (pV)) p + k % p of chunk (k % pV) / p, the k-th backward the
// same micro-batch of chunk V - 1 - (k % pV) / p.
Actions interleaved(int stage, int stages, int m, int chunks) {
  const int p = stages, V = chunks, total = m * V;
  const auto at = [&](PipelineAction::Kind kind, int k) {
    const int group = k / (p * V), within = k % (p * V);
    const int chunk = kind == PipelineAction::forward ? within / p : V - 1 - within / p;
    return PipelineAction{kind, group * p + k % p, chunk};
  };
  Actions a;
  const int warmup = std::min((p - stage - 1) * 2 + (V - 1) * p, total);
  for (int k = 0; k < warmup; k++) a.push_back(at(PipelineAction::forward, k));
  for (int i = 0; i < total - warmup; i++) {
    a.push_back(at(PipelineAction::forward, warmup + i));
    a.push_back(at(PipelineAction::backward, i));
  }
  for (int k = total - warmup; k < total; k++) a.push_back(at(PipelineAction::backward, k));
  return a;
}

// ZB-H1: 1F1B's forwards and input-gradient passes; stage s keeps up to s weight-gradient
// passes waiting (at most p micro-batches alive), one more per cooldown gap, the rest last.
Actions zb1(int stage, int stages, int m) {
  Actions a;
  const int warmup = std::min(stages - stage - 1, m);
  int next_forward = 0, next_backward = 0;
  std::deque<int> waiting;  // input gradient done, weight gradient not yet
  const auto input_gradient = [&] {
    a.push_back({PipelineAction::input_gradient, next_backward});
    waiting.push_back(next_backward++);
  };
  const auto weight_gradient = [&] {
    a.push_back({PipelineAction::weight_gradient, waiting.front()});
    waiting.pop_front();
  };
  for (int i = 0; i < warmup; i++) a.push_back({PipelineAction::forward, next_forward++});
  for (int i = 0; i < m - warmup; i++) {
    a.push_back({PipelineAction::forward, next_forward++});
    input_gradient();
    while (static_cast<int>(waiting.size()) > stage) weight_gradient();
  }
  for (int i = 0; i < warmup; i++) {
    input_gradient();
    weight_gradient();  // while the next gradient comes down the pipeline
  }
  while (!waiting.empty()) weight_gradient();
  return a;
}

}  // namespace

std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages, int micro_batches, int chunks) {
  check(chunks == 1 || schedule == Schedule::interleaved, "model chunks without the interleaved schedule");
  switch (schedule) {
    case Schedule::gpipe: return gpipe(micro_batches);
    case Schedule::one_f_one_b: return one_f_one_b(stage, stages, micro_batches);
    case Schedule::interleaved: return interleaved(stage, stages, micro_batches, chunks);
    case Schedule::zb1: return zb1(stage, stages, micro_batches);
  }
  return {};
}

ActivationSlots activation_slots(const std::vector<PipelineAction>& actions, int chunks) {
  const int n = static_cast<int>(actions.size());
  for (const PipelineAction& a : actions) chunks = std::max(chunks, a.chunk + 1);
  std::map<std::pair<int, int>, int> last;  // (micro-batch, chunk) -> index of its last action
  for (int i = 0; i < n; i++) last[{actions[i].micro_batch, actions[i].chunk}] = i;
  ActivationSlots s;
  s.slot.assign(n, -1);
  s.chunk_slot.assign(n, -1);
  s.chunk_slots.assign(chunks, 0);
  std::vector<bool> pool_taken;
  std::vector<std::vector<bool>> chunk_taken(chunks);
  std::map<std::pair<int, int>, std::pair<int, int>> held;  // (micro-batch, chunk) -> its two slots
  const auto lowest_free = [](std::vector<bool>& taken) {
    const auto free = std::find(taken.begin(), taken.end(), false);
    const int slot = static_cast<int>(free - taken.begin());
    if (free == taken.end()) taken.push_back(true);
    else *free = true;
    return slot;
  };
  for (int i = 0; i < n; i++) {
    const std::pair<int, int> pair{actions[i].micro_batch, actions[i].chunk};
    auto it = held.find(pair);
    if (it == held.end()) {  // its first action: a forward
      it = held.emplace(pair, std::make_pair(lowest_free(pool_taken), lowest_free(chunk_taken[pair.second]))).first;
      s.slots = std::max(s.slots, static_cast<int>(pool_taken.size()));
      s.chunk_slots[pair.second] = std::max(s.chunk_slots[pair.second], static_cast<int>(chunk_taken[pair.second].size()));
    }
    s.slot[i] = it->second.first;
    s.chunk_slot[i] = it->second.second;
    if (last.at(pair) == i) {
      pool_taken[it->second.first] = false;
      chunk_taken[pair.second][it->second.second] = false;
      held.erase(it);
    }
  }
  return s;
}

ActivationSlots activation_slots(Schedule schedule, int stage, int stages, int micro_batches, int chunks) {
  return activation_slots(stage_actions(schedule, stage, stages, micro_batches, chunks), chunks);
}

int max_in_flight(Schedule schedule, int stage, int stages, int micro_batches, int chunks) {
  return max_in_flight(stage_actions(schedule, stage, stages, micro_batches, chunks));
}

int max_in_flight(const std::vector<PipelineAction>& actions) { return activation_slots(actions).slots; }

std::vector<int> stage_layer_counts(int n_layer, int stages, const std::string& explicit_counts, int chunks) {
  require(stages <= n_layer, "parallel.pp (" + std::to_string(stages) + ") exceeds model.n_layer (" +
                                 std::to_string(n_layer) + "): every stage needs a layer");
  std::vector<int> counts;
  if (explicit_counts.empty()) {
    for (int s = 0; s < stages; s++) counts.push_back(n_layer / stages + (s < n_layer % stages ? 1 : 0));
  } else {
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
  }
  if (chunks > 1)
    for (int s = 0; s < stages; s++)
      if (counts[s] % chunks != 0) {
        // What would do: the vpp values that divide every stage's layers.
        std::string would;
        for (int v = 1; v <= counts[s]; v++)
          if (std::all_of(counts.begin(), counts.end(), [v](int c) { return c % v == 0; }))
            would += (would.empty() ? "" : ", ") + std::to_string(v);
        throw UsageError("parallel.vpp (" + std::to_string(chunks) + ") must divide the layers of every stage: stage " +
                         std::to_string(s) + " has " + std::to_string(counts[s]) + " (model.n_layer " +
                         std::to_string(n_layer) + " over parallel.pp " + std::to_string(stages) +
                         (explicit_counts.empty() ? "" : ", parallel.pp_layers " + explicit_counts) +
                         "); parallel.vpp " + would + " would do");
      }
  return counts;
}

StageSpec stage_spec(int n_layer, int stage, int stages, const std::string& pp_layers, int chunks) {
  const std::vector<int> counts = stage_layer_counts(n_layer, stages, pp_layers, chunks);
  StageSpec spec;
  spec.chunks.clear();
  // Virtual stage v = c * stages + s holds counts[s] / chunks layers, in order of v.
  int first = 0;
  for (int v = 0; v < stages * chunks; v++) {
    const int s = v % stages, layers = counts[s] / chunks;
    if (s == stage) spec.chunks.push_back({first, layers});
    first += layers;
  }
  spec.has_embedding = stage == 0;
  spec.has_head = stage == stages - 1;
  return spec;
}

}  // namespace trident
