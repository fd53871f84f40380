// Runs one rank's part of the pipeline: its schedule's actions in order (pipeline/
// schedule.h), each a pass of one micro-batch through one of the rank's model chunks,
// with the activations sent on to the next stage and the gradients back to the previous
// one (non-blocking sends, blocking receives), each (micro-batch, chunk) in an activation
// slot (pipeline/schedule.h: ActivationSlots). What a backward does with the gradients
// (scale, reduction) is the training step's (train/step_runner.h).
//
// Chunk c of stage s is virtual stage c * stages + s, so a micro-batch passes through
// every stage's chunk 0, then every stage's chunk 1, and so on (Megatron's interleaved
// layout); one chunk per rank but under the interleaved schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"
#include "parallel/communicator.h"
#include "pipeline/pipeline_links.h"
#include "pipeline/schedule_timing.h"

namespace trident {

class PipelineRunner {
 public:
  // model: this rank's stage, with its chunks (model.chunks()).
  PipelineRunner(Transformer& model, PipelineLinks links);

  // A backward pass (or half of one, under zb1) of the micro-batch in `slot` of `chunk`.
  using Backward = std::function<void(int chunk, int slot, BackwardPart part)>;
  // The step's forward and backward passes in the schedule's order, over `micro_batches`
  // micro-batches of micro_batch() sequences; inputs/targets [micro_batches * B, T] (host
  // memory). Returns once every send has left.
  void run_schedule(const int32_t* inputs, const int32_t* targets, int micro_batches, const Backward& backward_pass);
  // One micro-batch of B sequences through this rank's chunks, forward only, in slot 0
  // (its losses added to the total of the chunk holding the head).
  void forward_only(const int32_t* inputs, const int32_t* targets, int B);

  int stage() const { return links_.pp != nullptr ? links_.pp->rank() : 0; }
  int stages() const { return links_.pp != nullptr ? links_.pp->size() : 1; }
  Communicator* pp() const { return links_.pp; }  // null with one stage
  // Of the last run_schedule(): seconds spent in forward and backward passes (the rest
  // is this stage's share of the pipeline bubble).
  double compute_s() const { return compute_s_; }
  // The same by kind of pass (a whole backward counts as input gradients).
  const PassTimes& pass_s() const { return pass_s_; }

 private:
  // A chunk on some stage: where a transfer comes from or goes to.
  struct Place {
    int stage, chunk;
  };
  int chunks() const { return model_.chunks(); }
  Place place_of(int virtual_stage) const { return {virtual_stage % stages(), virtual_stage / stages()}; }
  Place upstream(int chunk) const { return place_of(chunk * stages() + stage() - 1); }
  Place downstream(int chunk) const { return place_of(chunk * stages() + stage() + 1); }
  // Each returns the seconds it computed (the transfers are not counted).
  double forward(int chunk, int micro_batch, int slot, int chunk_slot, const int32_t* inputs, const int32_t* targets,
                 int B);
  double backward(int chunk, int micro_batch, int slot, BackwardPart part, const Backward& backward_pass);

  Transformer& model_;
  PipelineLinks links_;
  std::vector<RequestPtr> activation_sends_;  // per slot: its output on its way, finished before the slot is reused
  RequestPtr gradient_send_;  // stage_gradient() still on its way (one buffer for every chunk)
  double compute_s_ = 0;
  PassTimes pass_s_;
};

}  // namespace trident
