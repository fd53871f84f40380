#include "train/divergence.h"

#include <cmath>
#include <cstdio>

namespace trident {

namespace {

std::string format(const char* pattern, double a, double b = 0, double c = 0) {
  char text[256];
  std::snprintf(text, sizeof text, pattern, a, b, c);
  return text;
}

}  // namespace

DivergenceGuard::Verdict DivergenceGuard::observe(int step, double loss, const GradientNorm& norm,
                                                  bool have_checkpoint) {
  message_.clear();
  if (!norm.skipped) {
    streak_ = 0;
    // Spikes against the mean of the steps before (after a few to settle on).
    if (spike_factor_ > 0 && finite_steps_ >= 5 && loss > spike_factor_ * running_mean_) {
      spikes_++;
      message_ = "step " + std::to_string(step) +
                 format(": loss spike: %.4f is %.1fx the running mean %.4f (train.spike_factor)", loss,
                        loss / running_mean_, running_mean_);
    }
    running_mean_ = finite_steps_ == 0 ? loss : 0.9 * running_mean_ + 0.1 * loss;
    finite_steps_++;
    return Verdict::ok;
  }
  streak_++;
  skipped_++;
  message_ = "step " + std::to_string(step) + format(": non-finite loss %g or gradient norm %g: update skipped", loss,
                                                      norm.norm) +
             " (" + std::to_string(streak_) + " in a row, " + std::to_string(skipped_) + " in all)";
  if (streak_ < max_bad_) return Verdict::skipped;
  if (!rolled_back_ && have_checkpoint) {
    rolled_back_ = true;
    streak_ = 0;
    message_ += "; " + std::to_string(max_bad_) + " in a row (train.max_bad_steps): going back to the last checkpoint";
    return Verdict::roll_back;
  }
  message_ = "the run diverged: " + std::to_string(max_bad_) + " steps in a row up to step " + std::to_string(step) +
             " had a non-finite loss or gradient norm (train.max_bad_steps), " +
             (rolled_back_ ? "again after going back to the last checkpoint"
                           : "and there is no checkpoint to go back to (checkpoint.dir, checkpoint.every_steps)") +
             "; no checkpoint was written since the first of them";
  return Verdict::diverged;
}

}  // namespace trident
