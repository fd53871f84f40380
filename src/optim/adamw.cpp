// AdamW as PyTorch does it (shared/reference/FORMAT.md): decoupled weight decay where the
// tensor's placement asks for it (tensors of 2 or more dimensions), bias-corrected
// moments exp_avg and exp_avg_sq (PyTorch's names, the checkpoint's too).
#include "optim/optimizer.h"

namespace trident {

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
        kernels::Kernels& k, const std::vector<FlatRange>& owned)
      : Optimizer(kind, layout, k, owned), settings_(settings) {}

 private:
  void update(float* param, const float* grad, float* const* state, size_t n, double lr, bool decay, int t,
              double grad_scale) override {
    k_.adamw_update(param, grad, state[0], state[1], n, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                    static_cast<float>(settings_.beta2), static_cast<float>(settings_.eps),
                    static_cast<float>(decay ? settings_.weight_decay : 0.0), t, static_cast<float>(grad_scale));
  }
  OptimizerSettings settings_;
};

// Read p, g, m, v (16 bytes), write p, m, v (12) and the bf16 copy (2).
const bool registered = register_optimizer(
    {"adamw", {"exp_avg", "exp_avg_sq"}, 30.0,
     [](const ParameterLayout& layout, const OptimizerSettings& settings, kernels::Kernels& k,
        const std::vector<FlatRange>& owned) -> std::unique_ptr<Optimizer> {
       return std::make_unique<AdamW>(optimizer_kind("adamw"), layout, settings, k, owned);
     }});

}  // namespace

}  // namespace trident
