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
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_links.h"
#include "pipeline/pipeline_runner.h"

namespace trident {

class StepRunner {
 public:
  StepRunner(Transformer& model, Optimizer& optimizer, DataParallel& data_parallel, Communicator& dp, kernels::Kernels& k,
             PipelineLinks pipeline = {});

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
  // The last compute_gradients()'s auxiliary losses (a mixture of experts' load balance and
  // z-loss), their mean over the global batch; beside the loss it returns, in the
  // objective the gradients are of. 0 for a dense model.
  double aux_loss() const { return aux_loss_; }
  // Its expert load per MoE layer over the global batch: the most loaded expert's tokens over
  // the mean expert's (1: balanced; E/K: every token to the same K). Empty for a dense model.
  const std::vector<double>& expert_load() const { return expert_load_; }
  // Its token-expert pairs per MoE layer and expert over the global batch (the routers'
  // choices, dropped ones too). Empty for a dense model.
  const std::vector<std::vector<double>>& expert_tokens() const { return expert_tokens_; }
  // Its expert-parallel exchanges' bytes, sent by all ranks (0 without expert parallelism),
  // the token-expert pairs routed, and those of them not computed (0: dropless).
  double all_to_all_bytes() const { return all_to_all_bytes_; }
  double tokens_routed() const { return tokens_routed_; }
  double tokens_dropped() const { return tokens_dropped_; }
  double compute_s() const { return compute_s_; }
  const PassTimes& pass_s() const { return pipeline_.pass_s(); }  // the same by kind of pass

 private:
  void sync_tied_embedding();
  uint64_t exchanged_bytes() const;  // all-to-all bytes this rank has sent over ep so far
  // The parts of shared key/value heads' gradients, summed over the ranks sharing them.
  void sum_shared_head_gradients();
  // Squared global L2 norm of the step's gradients over the whole model.
  double gradient_norm_squared();

  Transformer& model_;
  Optimizer& optimizer_;
  DataParallel& data_parallel_;
  Communicator& dp_;
  kernels::Kernels& k_;
  PipelineRunner pipeline_;  // this rank's stage of the model, `model_`, and its chunks
  double comm_wait_s_ = 0, compute_s_ = 0, aux_loss_ = 0, all_to_all_bytes_ = 0, tokens_routed_ = 0,
         tokens_dropped_ = 0;
  std::vector<double> expert_load_;
  std::vector<std::vector<double>> expert_tokens_;
  kernels::DeviceBuffer norm_total_;          // a double: the squared gradient norm, summed on the device
};

}  // namespace trident
