// Pipeline schedules: the order in which one stage runs the forward and backward passes
// of the step's micro-batches. Pure arithmetic, tested against the closed forms
// (tests/unit/test_schedule.cpp, with a timing model in pipeline/schedule_timing.h).
//
// GPipe: every forward, then every backward (in reverse), so all m micro-batches'
// activations are alive at once.
// 1F1B (PipeDream-flush, Megatron's default): stage s of p first runs warmup =
// min(p - s - 1, m) forwards, then alternates one forward and one backward (steady
// state), then runs the remaining backwards (cooldown); at most min(p - s, m)
// micro-batches are in flight; the bubble is (p-1)(F+B+W) of each stage's step.
// Interleaved 1F1B (Narayanan et al. 2021, Megatron's virtual pipeline): each rank holds
// V model chunks, chunk c of stage s being virtual stage c*p + s; the micro-batches go
// through the chunks in groups of p (m must be a multiple of p); warmup
// (p - s - 1) * 2 + (V - 1) * p (micro-batch, chunk) forwards; bubble (p-1)(F+B+W)/V.
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward split into its
// input-gradient half (B, sent upstream at once) and its weight-gradient half (W), which
// waits: stage s defers up to s of them, so that no stage holds more than p micro-batches
// (1F1B's stage 0 holds p), and fills the cooldown with the rest; bubble
// (p-1)(F+B-W) for W <= F (the paper's; in general (p-1) max(F, B, F+B-W)).
#pragma once

#include <string>
#include <vector>

#include "config/choices.h"
#include "model/parameters.h"

namespace trident {

// One entry of a stage's schedule: a pass of one micro-batch through one of the rank's
// model chunks (pipeline/pipeline_runner.h).
struct PipelineAction {
  enum Kind {
    forward,
    backward,         // the whole backward pass (gradients of the input and of the weights)
    input_gradient,   // zb1: the backward pass's input-gradient half (B), sent upstream
    weight_gradient,  // zb1: its weight-gradient half (W), deferred
  } kind;
  int micro_batch;
  int chunk = 0;  // index into the rank's chunks; one chunk per rank but under interleaved
  bool operator==(const PipelineAction&) const = default;
};
const char* action_name(PipelineAction::Kind kind);

// Stage `stage` of `stages`; `chunks` model chunks per rank (interleaved only, else 1).
std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages, int micro_batches, int chunks = 1);

// Where a stage keeps each (micro-batch, chunk)'s activations, as Megatron keeps them
// per (micro-batch, chunk): its blocks' buffers (and the chunk's input) in a slot of one
// pool shared by the rank's chunks, from its forward to its last action (the lowest free
// slot); the embedding's and the head's (one chunk holds each) in a slot among its
// chunk's own, assigned the same way. With one chunk the two are the same slot.
struct ActivationSlots {
  std::vector<int> slot;        // per action: its pool slot
  std::vector<int> chunk_slot;  // per action: its slot among its chunk's own
  int slots = 0;                // pool slots: the most (micro-batch, chunk) pairs alive at once
  std::vector<int> chunk_slots; // per chunk: the most of its micro-batches alive at once
};
ActivationSlots activation_slots(const std::vector<PipelineAction>& actions, int chunks = 1);
ActivationSlots activation_slots(Schedule schedule, int stage, int stages, int micro_batches, int chunks = 1);

// The pool slots a stage needs under the schedule: the most (micro-batch, chunk) pairs
// whose activations it holds at once (with one chunk: micro-batches).
int max_in_flight(Schedule schedule, int stage, int stages, int micro_batches, int chunks = 1);
// The same of a stage's actions.
int max_in_flight(const std::vector<PipelineAction>& actions);

// Layers of each stage: `explicit_counts` ("3,3,2") if given, else balanced (the first
// n_layer % stages stages get one more). Each a multiple of `chunks` (the stage's chunks
// share its layers equally). UsageError when they cannot work.
std::vector<int> stage_layer_counts(int n_layer, int stages, const std::string& explicit_counts, int chunks = 1);

// The part of the model stage `stage` of `stages` holds: with `chunks` > 1 chunk c holds
// virtual stage c * stages + stage's layers (stage s's count / chunks of them, the
// virtual stages' layers in order).
StageSpec stage_spec(int n_layer, int stage, int stages, const std::string& pp_layers, int chunks = 1);

}  // namespace trident
