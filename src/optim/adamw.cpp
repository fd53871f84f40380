// AdamW as PyTorch does it (shared/reference/FORMAT.md): decoupled weight decay where the
// tensor's placement asks for it (tensors of 2 or more dimensions), bias-corrected
// moments exp_avg and exp_avg_sq (PyTorch's names, the checkpoint's too).
#include "optim/optimizer.h"

namespace trident {

namespace {

class AdamW final : public Optimizer {
 public:
  using Optimizer::Optimizer;

 private:
  void update(float* param, const float* grad, float* const* state, size_t n, double lr, double weight_decay, int t,
              double grad_scale) override {
    k_.adamw_update(param, grad, state[0], state[1], n, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                    static_cast<float>(settings_.beta2), static_cast<float>(settings_.eps),
                    static_cast<float>(weight_decay), t, static_cast<float>(grad_scale));
  }
};

// An update reads p, g, m, v (16 bytes), writes p, m, v (12) and the bf16 copy (2).
const bool registered = register_optimizer({"adamw", {"exp_avg", "exp_avg_sq"}, 30.0, make_as<AdamW>});

}  // namespace

}  // namespace trident
