// Pipeline schedules: the order in which one stage runs the forward and backward passes
// of the step's micro-batches. Pure arithmetic, tested against the closed forms.
//
// GPipe: every forward, then every backward (in reverse), so all m micro-batches'
// activations are alive at once. 1F1B (PipeDream-flush, Megatron's default): stage s of p
// first runs warmup = min(p - s - 1, m) forwards, then alternates one forward and one
// backward (steady state), then runs the remaining backwards (cooldown); at most
// min(p - s, m) micro-batches are in flight, and the bubble is the same (p-1)/(m+p-1).
#pragma once

#include <string>
#include <vector>

#include "config/choices.h"
#include "model/parameters.h"

namespace trident {

// One entry of a stage's schedule: a forward or backward pass of one micro-batch through
// one of the rank's model chunks (pipeline/pipeline_runner.h).
struct PipelineAction {
  enum Kind { forward, backward } kind;
  int micro_batch;
  int chunk = 0;  // index into the rank's chunks; one chunk per rank under 1F1B and GPipe
  bool operator==(const PipelineAction&) const = default;
};

std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages, int micro_batches);

// Most micro-batches whose activations a stage holds at once under the schedule.
int max_in_flight(Schedule schedule, int stage, int stages, int micro_batches);

// Layers of each stage: `explicit_counts` ("3,3,2") if given, else balanced (the first
// n_layer % stages stages get one more). UsageError when they cannot work.
std::vector<int> stage_layer_counts(int n_layer, int stages, const std::string& explicit_counts);

// The part of the model stage `stage` of `stages` holds.
StageSpec stage_spec(int n_layer, int stage, int stages, const std::string& pp_layers);

}  // namespace trident
