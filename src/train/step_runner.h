// One optimizer step on one rank, in two halves that `train` and `verify` share:
// gradients (micro-batches with accumulation, reduction over dp overlapped with the
// last backward) and the update (global norm, clipping, AdamW, ZeRO-1 gather).
#pragma once

#include <cstdint>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "optim/adamw.h"

namespace trident {

class StepRunner {
 public:
  StepRunner(GPT2& model, AdamW& optimizer, DataParallel& data_parallel, Communicator& dp, kernels::Kernels& k);

  // inputs/targets: this rank's local_batch sequences [local_batch, T] of a global
  // batch of global_batch sequences. Returns the mean loss over the global batch.
  double compute_gradients(const int32_t* inputs, const int32_t* targets, int local_batch, int global_batch);
  // Clips by the global gradient norm and applies AdamW; returns the norm before clipping.
  GradientNorm update(double lr, double grad_clip);

  // Seconds the last compute_gradients() waited for the data-parallel reduction.
  double comm_wait_s() const { return comm_wait_s_; }

 private:
  // Squared global L2 norm of the step's gradients over the whole model.
  double gradient_norm_squared();

  GPT2& model_;
  AdamW& optimizer_;
  DataParallel& data_parallel_;
  Communicator& dp_;
  kernels::Kernels& k_;
  double comm_wait_s_ = 0;
};

}  // namespace trident
