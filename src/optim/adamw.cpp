#include "optim/adamw.h"

#include <cmath>

namespace trident {

AdamW::AdamW(const ParameterLayout& layout, const AdamWSettings& settings, kernels::Kernels& k)
    : layout_(layout), settings_(settings), k_(k), m_(k, layout.total_floats()), v_(k, layout.total_floats()) {}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
  t_++;
  for (const ParameterTensor& t : layout_.tensors()) {
    const double decay = t.weight_decay ? settings_.weight_decay : 0.0;
    k_.adamw_update(params + t.offset, grads + t.offset, m_.data() + t.offset, v_.data() + t.offset,
                    t.stored, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                    static_cast<float>(settings_.beta2), static_cast<float>(settings_.eps),
                    static_cast<float>(decay), t_, static_cast<float>(grad_scale));
  }
}

GradientNorm clip_gradients(kernels::Kernels& k, const float* grads, size_t n, double grad_clip) {
  GradientNorm g;
  g.norm = std::sqrt(k.sum_squares(grads, n));
  if (grad_clip > 0) g.clip_coefficient = std::min(1.0, grad_clip / (g.norm + 1e-6));
  return g;
}

}  // namespace trident
