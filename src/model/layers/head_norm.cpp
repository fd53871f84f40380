#include "model/layers/head_norm.h"

namespace trident {

void HeadNorm::declare_parameters(ParameterDeclarations& d) {
  weight_ = d.add({.name = name_ + ".weight", .shape = {hd_}, .init = Init::ones, .summed_over = kDataParallel | AxisSet{MeshAxis::tp}});
}

void HeadNorm::declare_activations(ActivationDeclarations& a, int heads, int column, int row_width) {
  heads_ = heads;
  column_ = column;
  row_width_ = row_width;
  const size_t BT = a.shape().tokens(), width = static_cast<size_t>(heads) * hd_;
  input_ = a.keep(BT * width, Element::act, Retention::dropped_by_full);
  rstd_ = a.keep(BT * heads, Element::f32, Retention::dropped_by_full);
  if (a.shape().deferred_weight_gradients) stash_ = a.keep(hd_, Element::f32);
  a.scratch(a_, "head norm a", BT * width, Element::act);
  a.scratch(b_, "head norm b", BT * width, Element::act);
}

void HeadNorm::forward(LayerRuntime& r, const Pass& p, Act* qkv) const {
  const int BT = p.B * r.T, width = heads_ * hd_;
  Act* columns = kernels::offset(qkv, column_, r.k.activation_type());
  Act* input = r.kept(p.slot, input_);
  r.k.copy_columns(input, width, columns, row_width_, BT, width);
  r.k.rmsnorm_forward(a_, r.kept<float>(p.slot, rstd_), input, r.weight(weight_), BT * heads_, hd_, eps_);
  r.k.copy_columns(columns, row_width_, a_, width, BT, width);
}

void HeadNorm::backward(LayerRuntime& r, const Pass& p, Act* dqkv) const {
  const int BT = p.B * r.T, width = heads_ * hd_;
  Act* columns = kernels::offset(dqkv, column_, r.k.activation_type());
  r.k.copy_columns(a_, width, columns, row_width_, BT, width);  // d loss / d output
  r.k.fill_zero(b_, r.k.activation_bytes(static_cast<size_t>(BT) * width));  // the kernel adds into it
  float* dweight = r.grad(weight_);
  if (p.defer) {
    dweight = r.kept<float>(p.slot, stash_);
    r.k.fill_zero(dweight, hd_ * sizeof(float));
  }
  r.k.rmsnorm_backward(b_, dweight, a_, r.kept(p.slot, input_), r.weight(weight_), r.kept<float>(p.slot, rstd_),
                       BT * heads_, hd_);
  r.k.copy_columns(columns, row_width_, b_, width, BT, width);
}

void HeadNorm::weight_gradients(LayerRuntime& r, const Pass& p) const {
  r.k.add_f32(r.grad(weight_), r.kept<float>(p.slot, stash_), hd_);
}

}  // namespace trident
