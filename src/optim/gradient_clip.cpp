#include "optim/gradient_clip.h"

#include <algorithm>
#include <cmath>

namespace trident {

double clip_coefficient(double norm, double grad_clip) {
  return grad_clip > 0 ? std::min(1.0, grad_clip / (norm + 1e-6)) : 1.0;
}

GradientNorm clip_gradients(kernels::Kernels& k, const float* grads, size_t n, double grad_clip) {
  GradientNorm g;
  g.norm = std::sqrt(k.sum_squares(grads, n));
  g.clip_coefficient = clip_coefficient(g.norm, grad_clip);
  return g;
}

}  // namespace trident
