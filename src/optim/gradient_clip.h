// Clipping by the global gradient norm (Megatron's --clip-grad, PyTorch's
// clip_grad_norm_): the coefficient every gradient is scaled by before the update.
#pragma once

#include <cstddef>

#include "kernels/kernels.h"

namespace trident {

// Clip coefficient min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double clip_coefficient(double norm, double grad_clip);

struct GradientNorm {
  double norm = 0.0;
  double clip_coefficient = 1.0;
  bool skipped = false;  // non-finite loss or norm: no update was applied
};
// Global L2 norm of all n gradients of one rank, and the clip coefficient.
GradientNorm clip_gradients(kernels::Kernels& k, const float* grads, size_t n, double grad_clip);

}  // namespace trident
