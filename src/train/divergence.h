// What a step's outcome means for the run. A non-finite loss or gradient norm skips the
// update on every rank (StepRunner::update: parameters and optimizer state untouched);
// train.max_bad_steps such steps in a row send the run back to its last checkpoint,
// once; a second such streak ends it (exit 4, DivergedError), and no checkpoint is
// written during a streak, so `latest` never names one taken in the middle of it. A
// finite loss above train.spike_factor times its running mean is reported.
// Every rank sees the same (globally reduced) loss and norm, so every rank reaches the
// same verdict without communicating.
#pragma once

#include <string>

#include "optim/gradient_clip.h"
#include "runtime/exit_codes.h"

namespace trident {

class DivergenceGuard {
 public:
  DivergenceGuard(int max_bad_steps, double spike_factor) : max_bad_(max_bad_steps), spike_factor_(spike_factor) {}

  enum class Verdict { ok, skipped, roll_back, diverged };
  // After step `step` (as printed, from 1): its mean loss and gradient norm, whether its
  // update was skipped, and whether a complete checkpoint exists to go back to.
  Verdict observe(int step, double loss, const GradientNorm& norm, bool have_checkpoint);

  // A line for rank 0 to print about the last observation (empty: nothing to say).
  const std::string& message() const { return message_; }
  bool in_streak() const { return streak_ > 0; }
  int skipped_steps() const { return skipped_; }
  int loss_spikes() const { return spikes_; }  // reported so far

 private:
  int max_bad_;
  double spike_factor_;
  int streak_ = 0, skipped_ = 0, finite_steps_ = 0, spikes_ = 0;
  bool rolled_back_ = false;
  double running_mean_ = 0;
  std::string message_;
};

}  // namespace trident
