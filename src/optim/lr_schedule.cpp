#include "optim/lr_schedule.h"

#include <cstdio>

namespace trident {

std::string LearningRateSchedule::describe() const {
  char text[256];
  const int n = std::snprintf(text, sizeof text, "%s: warmup %d steps to %.2e", name_of(shape), warmup_steps, lr);
  if (shape == LrShape::constant) return text;
  if (shape == LrShape::wsd)
    std::snprintf(text + n, sizeof text - n, ", stable to step %d, then linear down to %.2e at step %d",
                  std::max(warmup_steps, decay_steps - wsd_decay), min_lr, decay_steps);
  else
    std::snprintf(text + n, sizeof text - n, ", then down to %.2e at step %d (and after)", min_lr, decay_steps);
  return text;
}

}  // namespace trident
