// One optimizer step on one rank, in two halves that `train` and `verify` share:
// gradients (the pipeline's forward and backward passes over the micro-batches,
// pipeline/pipeline_runner.h, with gradient accumulation, the reduction over dp
// overlapped with the last backward, the tied embedding's sum between the first and last
// stage) and the update (global norm, clipping, the optimizer, ZeRO-1 gather).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_state.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_links.h"
#include "pipeline/pipeline_runner.h"
#include "train/router_totals.h"

namespace trident {

class StepRunner {
 public:
  // mesh: the groups over which each tensor's gradient is completed as its placement says
  // (model/placement.h), asked for by normalized, non-empty axis sets, and dp x cp's (the
  // losses' sums, maybe one rank); zero_axes: those ZeRO shards dp x cp's tensors over (dp x cp, or
  // hybrid sharding's dp_shard).
  StepRunner(Transformer& model, Optimizer& optimizer, DataParallel& data_parallel, MeshGroups mesh,
             kernels::Kernels& k, PipelineLinks pipeline = {}, AxisSet zero_axes = kDataParallel);

  // inputs/targets: this rank's local_batch sequences [local_batch, T] of a global
  // batch of global_batch sequences. Returns the mean loss over the global batch.
  double compute_gradients(const int32_t* inputs, const int32_t* targets, int local_batch, int global_batch);
  // Clips by the global gradient norm and applies the optimizer; returns the norm before clipping.
  // A non-finite norm (or loss_finite false) skips the update on every rank: parameters
  // and optimizer state stay as they were (train/divergence.h).
  GradientNorm update(double lr, double grad_clip, bool loss_finite = true);
  // Forward passes only: the mean loss over the global batch.
  double evaluate(const int32_t* inputs, const int32_t* targets, int local_batch, int global_batch);
  // One micro-batch of B sequences through this rank's pipeline, forward only: its mean
  // loss on the last stage, 0 elsewhere (no reduction over pp or dp).
  double forward_loss(const int32_t* inputs, const int32_t* targets, int B);
  // The logits after `tokens` [T] at position `position`, over the whole vocabulary, on
  // every rank of the stage's pipeline (a forward pass of one sequence; collective).
  std::vector<float> next_token_logits(const int32_t* tokens, int position);

  // Of the last compute_gradients(): seconds spent waiting for the data-parallel
  // reduction after backward, and computing (the forward and backward passes; the
  // rest of the step is this stage's share of the pipeline bubble).
  double comm_wait_s() const { return comm_wait_s_; }
  // The last compute_gradients()'s routing figures (a mixture's routers'; the auxiliary
  // losses beside the loss it returns, in the objective the gradients are of).
  const RouterTotals& routing() const { return routers_; }
  double compute_s() const { return compute_s_; }
  const PassTimes& pass_s() const { return pipeline_.pass_s(); }  // the same by kind of pass

 private:
  // The sums a placement asks for besides data parallelism's: over the pipeline's ends
  // before it (a tied table, this rank's whole gradient), over tp's cuts after it (on the
  // reduced ranges this rank owns).
  void sum_over_stages();
  void sum_over_tensor_parallel();
  // Squared global L2 norm of the step's gradients over the whole model.
  double gradient_norm_squared();
  // The axes a tensor's squared norm is summed over: the model's (tp, pp), those it is
  // sharded over, and with ZeRO those its reduced gradient is sharded over.
  AxisSet norm_axes(const Placement& p) const;
  // The communicator of the ranks `axes` span; null when that is this rank alone.
  Communicator* group_of(AxisSet axes);

  Transformer& model_;
  Optimizer& optimizer_;
  DataParallel& data_parallel_;
  MeshGroups mesh_;
  Communicator& dp_;  // dp x cp: the losses' sums
  AxisSet zero_axes_;
  // The distinct norm_axes() of the layout's tensors (in order of their bits), and each
  // tensor's index among them: one sum each.
  std::vector<AxisSet> norm_sets_;
  std::vector<int> norm_set_of_;
  // Per tensor, the group its gradient is summed over before the data-parallel reduction
  // (a tied table's pipeline ends) and after it (tp's cuts); null: none.
  static constexpr AxisSet kBeforeDataParallel = {MeshAxis::pp_ends};
  std::vector<Communicator*> ends_sum_, tp_sum_;
  kernels::Kernels& k_;
  PipelineRunner pipeline_;  // this rank's stage of the model, `model_`, and its chunks
  double comm_wait_s_ = 0, compute_s_ = 0;
  RouterTotals routers_;
  kernels::DeviceBuffer norm_total_;  // per norm set, a double: its squared norm, summed on the device
};

}  // namespace trident
