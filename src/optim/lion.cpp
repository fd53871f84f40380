// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; DeepSpeed's
// FusedLion, lion-pytorch): the update is the sign of an interpolation of the momentum
// and the gradient, so every parameter moves by exactly lr; one state buffer, the
// momentum exp_avg. Decoupled weight decay where the tensor's placement asks for it:
//   c = beta1 m + (1 - beta1) g;  p = p (1 - lr wd) - lr sign(c);  m = beta2 m + (1 - beta2) g.
// Its learning rate is usually 3-10x smaller than AdamW's, its weight decay as much larger.
#include "optim/optimizer.h"

namespace trident {

namespace {

class Lion final : public Optimizer {
 public:
  using Optimizer::Optimizer;

 private:
  void update(float* param, const float* grad, float* const* state, size_t n, double lr, double weight_decay,
              int /*t*/, double grad_scale) override {
    k_.lion_update(param, grad, state[0], n, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                   static_cast<float>(settings_.beta2), static_cast<float>(weight_decay),
                   static_cast<float>(grad_scale));
  }
};

// An update reads p, g, m (12 bytes), writes p, m (8) and the bf16 copy (2).
const bool registered = register_optimizer({"lion", {"exp_avg"}, 22.0, make_as<Lion>});

}  // namespace

}  // namespace trident
