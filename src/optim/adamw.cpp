#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace trident {

std::vector<AdamW::Segment> AdamW::segments_of(const ParameterLayout& layout, const std::vector<FlatRange>& owned) {
  const std::vector<FlatRange> ranges = owned.empty() ? std::vector<FlatRange>{{0, layout.total_floats()}} : owned;
  std::vector<Segment> segments;
  size_t state = 0;
  for (const FlatRange& r : ranges) {
    for (const ParameterTensor& t : layout.tensors()) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin >= end) continue;
      segments.push_back({begin, state, end - begin, t.weight_decay});
      state += end - begin;
    }
  }
  return segments;
}

size_t AdamW::state_floats_for(const ParameterLayout& layout, const std::vector<FlatRange>& owned) {
  size_t floats = 0;
  for (const Segment& s : segments_of(layout, owned)) floats += 2 * s.size;
  return floats;
}

AdamW::AdamW(const ParameterLayout& layout, const AdamWSettings& settings, kernels::Kernels& k,
             const std::vector<FlatRange>& owned)
    : settings_(settings), k_(k), segments_(segments_of(layout, owned)) {
  const size_t state = state_floats_for(layout, owned) / 2;
  m_ = kernels::DeviceBuffer(k, state);
  v_ = kernels::DeviceBuffer(k, state);
}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
  step(params, [grads](size_t offset) { return grads + offset; }, lr, grad_scale);
}

void AdamW::step(float* params, const std::function<const float*(size_t)>& gradient_at, double lr,
                 double grad_scale) {
  step([params](size_t offset) { return params + offset; }, gradient_at, lr, grad_scale);
}

void AdamW::step(const std::function<float*(size_t)>& parameter_at,
                 const std::function<const float*(size_t)>& gradient_at, double lr, double grad_scale) {
  t_++;
  for (const Segment& s : segments_) {
    const double decay = s.decay ? settings_.weight_decay : 0.0;
    k_.adamw_update(parameter_at(s.offset), gradient_at(s.offset), m_.data() + s.state_offset, v_.data() + s.state_offset,
                    s.size, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                    static_cast<float>(settings_.beta2), static_cast<float>(settings_.eps),
                    static_cast<float>(decay), t_, static_cast<float>(grad_scale));
  }
}

void AdamW::moment_to_host(Moment which, float* full, size_t n) const {
  const kernels::DeviceBuffer& moment = which == Moment::exp_avg ? m_ : v_;
  std::fill(full, full + n, 0.0f);
  for (const Segment& s : segments_)
    k_.copy_to_host(full + s.offset, moment.data() + s.state_offset, s.size * sizeof(float));
}

void AdamW::moment_from_host(Moment which, const float* full) {
  kernels::DeviceBuffer& moment = which == Moment::exp_avg ? m_ : v_;
  for (const Segment& s : segments_)
    k_.copy_to_device(moment.data() + s.state_offset, full + s.offset, s.size * sizeof(float));
}

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
