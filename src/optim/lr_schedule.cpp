#include "optim/lr_schedule.h"

#include <cstdio>

#include "kernels/base/error.h"

namespace trident {

LrShape parse_lr_shape(const std::string& name) {
  if (name == "cosine") return LrShape::cosine;
  if (name == "linear") return LrShape::linear;
  if (name == "constant") return LrShape::constant;
  if (name == "wsd") return LrShape::wsd;
  throw UsageError("train.lr_schedule must be cosine, linear, constant or wsd, got '" + name + "'");
}

const char* lr_shape_name(LrShape shape) {
  switch (shape) {
    case LrShape::cosine: return "cosine";
    case LrShape::linear: return "linear";
    case LrShape::constant: return "constant";
    case LrShape::wsd: return "wsd";
  }
  return "?";
}

std::string LearningRateSchedule::describe() const {
  char text[256];
  const int n = std::snprintf(text, sizeof text, "%s: warmup %d steps to %.2e", lr_shape_name(shape), warmup_steps, lr);
  if (shape == LrShape::constant) return text;
  if (shape == LrShape::wsd)
    std::snprintf(text + n, sizeof text - n, ", stable to step %d, then linear down to %.2e at step %d",
                  std::max(warmup_steps, decay_steps - wsd_decay), min_lr, decay_steps);
  else
    std::snprintf(text + n, sizeof text - n, ", then down to %.2e at step %d (and after)", min_lr, decay_steps);
  return text;
}

}  // namespace trident
