#include "model/layers/norm.h"

namespace trident {

void Norm::declare_parameters(ParameterDeclarations& d) {
  weight_ = d.add({.name = name_ + ".weight", .shape = {C_}, .init = Init::ones,
                   .summed_over = kDataParallel | AxisSet{MeshAxis::sp}});
  if (layernorm())
    bias_ = d.add({.name = name_ + ".bias", .shape = {C_}, .init = Init::zeros,
                   .summed_over = kDataParallel | AxisSet{MeshAxis::sp}});
}

void Norm::declare_activations(ActivationDeclarations& a) {
  const size_t rows = a.shape().rows();
  out_ = a.keep(rows * C_, Element::act, Retention::dropped_by_full);
  if (layernorm()) mean_ = a.keep(rows, Element::f32, Retention::dropped_by_full);
  rstd_ = a.keep(rows, Element::f32, Retention::dropped_by_full);
  if (a.shape().deferred_weight_gradients) stash_ = a.keep(2 * static_cast<size_t>(C_), Element::f32);
}

const kernels::Act* Norm::forward(LayerRuntime& r, const Pass& p, const kernels::Act* in) const {
  kernels::Act* out = r.kept(p.slot, out_);
  float* rstd = r.kept<float>(p.slot, rstd_);
  const int N = r.regions.rows(p.B);
  if (layernorm())
    r.k.layernorm_forward(out, r.kept<float>(p.slot, mean_), rstd, in, r.weight(weight_), r.weight(bias_), N, C_, eps_);
  else
    r.k.rmsnorm_forward(out, rstd, in, r.weight(weight_), N, C_, eps_);
  return out;
}

void Norm::backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout, const kernels::Act* in,
                    kernels::Act* din) const {
  float *dweight = r.grad(weight_), *dbias = r.grad(bias_);
  if (p.defer) {
    float* stash = r.kept<float>(p.slot, stash_);
    r.k.fill_zero(stash, 2 * C_ * sizeof(float));
    dweight = stash;
    dbias = bias_ >= 0 ? stash + C_ : nullptr;
  }
  const float* rstd = r.kept<float>(p.slot, rstd_);
  const int N = r.regions.rows(p.B);
  if (layernorm())
    r.k.layernorm_backward(din, dweight, dbias, dout, in, r.weight(weight_), r.kept<float>(p.slot, mean_), rstd, N, C_);
  else
    r.k.rmsnorm_backward(din, dweight, dout, in, r.weight(weight_), rstd, N, C_);
}

void Norm::weight_gradients(LayerRuntime& r, const Pass& p) const {
  const float* stash = r.kept<float>(p.slot, stash_);
  r.k.add_f32(r.grad(weight_), stash, C_);
  if (bias_ >= 0) r.k.add_f32(r.grad(bias_), stash + C_, C_);
}

}  // namespace trident
