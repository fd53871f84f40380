#include "optim/optimizer.h"

#include <algorithm>

#include "config/registry.h"

namespace trident {

namespace {

Registry<OptimizerKind>& registry() {
  static Registry<OptimizerKind> optimizers("train.optimizer");
  return optimizers;
}

}  // namespace

bool register_optimizer(OptimizerKind kind) {
  const std::string name = kind.name;
  return registry().add(name, std::move(kind));
}

const OptimizerKind& optimizer_kind(const std::string& name) { return registry().at(name); }

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const ParameterLayout& layout,
                                          const OptimizerSettings& settings, kernels::Kernels& k,
                                          const std::vector<FlatRange>& owned) {
  const OptimizerKind& kind = optimizer_kind(name);
  return kind.make(kind, layout, settings, k, owned);
}

std::vector<Optimizer::Segment> Optimizer::segments_of(const ParameterLayout& layout,
                                                       const std::vector<FlatRange>& owned) {
  const std::vector<FlatRange> ranges = owned.empty() ? std::vector<FlatRange>{{0, layout.total_floats()}} : owned;
  std::vector<Segment> segments;
  size_t state = 0;
  for (const FlatRange& r : ranges) {
    for (const ParameterTensor& t : layout.tensors()) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin >= end) continue;
      segments.push_back({begin, state, end - begin, t.placement.weight_decay});
      state += end - begin;
    }
  }
  return segments;
}

size_t OptimizerKind::state_floats_for(const ParameterLayout& layout, const std::vector<FlatRange>& owned) const {
  size_t floats = 0;
  for (const Optimizer::Segment& s : Optimizer::segments_of(layout, owned)) floats += s.size;
  return floats * state_names.size();
}

Optimizer::Optimizer(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
                     kernels::Kernels& k, const std::vector<FlatRange>& owned)
    : settings_(settings), k_(k), kind_(kind), segments_(segments_of(layout, owned)) {
  const size_t floats = kind.state_floats_for(layout, owned) / std::max<size_t>(1, kind.state_names.size());
  for (size_t i = 0; i < kind.state_names.size(); i++) state_.emplace_back(k, floats);
}

void Optimizer::step(float* params, const float* grads, double lr, double grad_scale) {
  step([params](size_t offset) { return params + offset; }, [grads](size_t offset) { return grads + offset; }, lr,
       grad_scale);
}

void Optimizer::step(const ParameterAt& parameter_at, const GradientAt& gradient_at, double lr, double grad_scale) {
  t_++;
  std::vector<float*> state(state_.size());
  for (const Segment& s : segments_) {
    for (size_t i = 0; i < state_.size(); i++) state[i] = state_[i].data() + s.state_offset;
    update(parameter_at(s.offset), gradient_at(s.offset), state.data(), s.size, lr,
           s.decay ? settings_.weight_decay : 0.0, t_, grad_scale);
  }
}

void Optimizer::state_to_host(size_t i, float* full, size_t n) const {
  std::fill(full, full + n, 0.0f);
  for (const Segment& s : segments_)
    k_.copy_to_host(full + s.offset, state_.at(i).data() + s.state_offset, s.size * sizeof(float));
}

void Optimizer::state_from_host(size_t i, const float* full) {
  for (const Segment& s : segments_)
    k_.copy_to_device(state_.at(i).data() + s.state_offset, full + s.offset, s.size * sizeof(float));
}

size_t Optimizer::state_floats() const {
  size_t floats = 0;
  for (const kernels::DeviceBuffer& b : state_) floats += b.size();
  return floats;
}

}  // namespace trident
