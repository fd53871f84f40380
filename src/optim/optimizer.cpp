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
                                          const std::vector<FlatRange>& owned, const OptimizerMesh& mesh) {
  const OptimizerKind& kind = optimizer_kind(name);
  return kind.make(kind, layout, settings, k, owned, mesh);
}

std::vector<Optimizer::Segment> Optimizer::segments_of(const OptimizerKind& kind, const ParameterLayout& layout,
                                                       const std::vector<FlatRange>& owned) {
  const std::vector<FlatRange> ranges = owned.empty() ? std::vector<FlatRange>{{0, layout.total_floats()}} : owned;
  std::vector<Segment> segments;
  std::vector<size_t> state(kind.state_names.size(), 0);  // each buffer's floats so far
  for (const FlatRange& r : ranges) {
    for (size_t index = 0; index < layout.tensors().size(); index++) {
      const ParameterTensor& t = layout.tensors()[index];
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin >= end) continue;
      Segment s{begin, end - begin, std::vector<size_t>(state.size(), kNoState), t.placement.weight_decay,
                static_cast<int>(index)};
      for (size_t i = 0; i < state.size(); i++) {
        if (!kind.holds_tensor(i, layout, t)) continue;
        s.state_offset[i] = state[i];
        state[i] += s.size;
      }
      segments.push_back(std::move(s));
    }
  }
  return segments;
}

size_t OptimizerKind::state_floats_for(const ParameterLayout& layout, const std::vector<FlatRange>& owned) const {
  size_t floats = 0;
  for (const Optimizer::Segment& s : Optimizer::segments_of(*this, layout, owned))
    for (size_t offset : s.state_offset)
      if (offset != Optimizer::kNoState) floats += s.size;
  return floats;
}

Optimizer::Optimizer(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
                     kernels::Kernels& k, const std::vector<FlatRange>& owned, const OptimizerMesh& mesh)
    : settings_(settings), k_(k), layout_(layout), mesh_(mesh), kind_(kind),
      segments_(segments_of(kind, layout, owned)) {
  for (size_t i = 0; i < kind.state_names.size(); i++) {
    size_t floats = 0;
    for (const Segment& s : segments_)
      if (s.state_offset[i] != kNoState) floats += s.size;
    state_.emplace_back(k, floats);
  }
}

float* Optimizer::state_of(size_t i, const Segment& s) {
  return s.state_offset[i] == kNoState ? nullptr : state_[i].data() + s.state_offset[i];
}

void Optimizer::step(float* params, const float* grads, double lr, double grad_scale) {
  step([params](size_t offset) { return params + offset; }, [grads](size_t offset) { return grads + offset; }, lr,
       grad_scale);
}

void Optimizer::step(const ParameterAt& parameter_at, const GradientAt& gradient_at, double lr, double grad_scale) {
  const int t = advance_step();
  std::vector<float*> state(state_.size());
  for (const Segment& s : segments_) {
    for (size_t i = 0; i < state_.size(); i++) state[i] = state_of(i, s);
    update(parameter_at(s.offset), gradient_at(s.offset), state.data(), s.size, lr,
           s.decay ? settings_.weight_decay : 0.0, t, grad_scale);
  }
}

void Optimizer::state_to_host(size_t i, float* full, size_t n) const {
  std::fill(full, full + n, 0.0f);
  for (const Segment& s : segments_)
    if (s.state_offset[i] != kNoState)
      k_.copy_to_host(full + s.offset, state_.at(i).data() + s.state_offset[i], s.size * sizeof(float));
}

void Optimizer::state_from_host(size_t i, const float* full) {
  for (const Segment& s : segments_)
    if (s.state_offset[i] != kNoState)
      k_.copy_to_device(state_.at(i).data() + s.state_offset[i], full + s.offset, s.size * sizeof(float));
}

size_t Optimizer::state_floats() const {
  size_t floats = 0;
  for (const kernels::DeviceBuffer& b : state_) floats += b.size();
  return floats;
}

}  // namespace trident
