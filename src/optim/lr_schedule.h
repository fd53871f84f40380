#pragma once

#include <cmath>

namespace trident {

// Linear warmup from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at
// the last step (as llm.c and nanoGPT do). step counts from 0.
struct LearningRateSchedule {
  double lr = 1e-3, min_lr = 0.0;
  int warmup_steps = 0, total_steps = 1;

  double at(int step) const {
    if (step < warmup_steps) return lr * (step + 1) / warmup_steps;
    const int decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 1) return lr;
    const double progress = static_cast<double>(step - warmup_steps) / (decay_steps - 1);
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
  }
};

}  // namespace trident
