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
  Lion(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
       kernels::Kernels& k, const std::vector<FlatRange>& owned)
      : Optimizer(kind, layout, k, owned), settings_(settings) {}

 private:
  void update(float* param, const float* grad, float* const* state, size_t n, double lr, bool decay, int /*t*/,
              double grad_scale) override {
    k_.lion_update(param, grad, state[0], n, static_cast<float>(lr), static_cast<float>(settings_.beta1),
                   static_cast<float>(settings_.beta2), static_cast<float>(decay ? settings_.weight_decay : 0.0),
                   static_cast<float>(grad_scale));
  }
  OptimizerSettings settings_;
};

// Read p, g, m (12 bytes), write p, m (8) and the bf16 copy (2).
const bool registered = register_optimizer(
    {"lion", {"exp_avg"}, 22.0,
     [](const ParameterLayout& layout, const OptimizerSettings& settings, kernels::Kernels& k,
        const std::vector<FlatRange>& owned) -> std::unique_ptr<Optimizer> {
       return std::make_unique<Lion>(optimizer_kind("lion"), layout, settings, k, owned);
     }});

}  // namespace

}  // namespace trident
