// AdamW over a model's flat parameter buffer, as PyTorch does it (FORMAT.md): decoupled
// weight decay on tensors of 2 or more dimensions only, bias-corrected moments. The
// moments live in the backend's memory beside the parameters.
#pragma once

#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "model/parameters.h"

namespace trident {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  AdamW(const ParameterLayout& layout, const AdamWSettings& settings, kernels::Kernels& k);

  // One update with learning rate lr on gradients multiplied by grad_scale (the clip
  // coefficient). Advances the step count t first (bias correction counts from 1).
  void step(float* params, const float* grads, double lr, double grad_scale);

  int steps_taken() const { return t_; }
  float* m() const { return m_.data(); }
  float* v() const { return v_.data(); }
  size_t state_floats() const { return m_.size() + v_.size(); }

 private:
  const ParameterLayout& layout_;
  AdamWSettings settings_;
  kernels::Kernels& k_;
  DeviceBuffer m_, v_;
  int t_ = 0;
};

// Global L2 norm of all gradients, and the clip coefficient min(1, clip / (norm + 1e-6))
// (1 when clip is 0).
struct GradientNorm {
  double norm = 0.0;
  double clip_coefficient = 1.0;
};
GradientNorm clip_gradients(kernels::Kernels& k, const float* grads, size_t n, double grad_clip);

}  // namespace trident
