#include "model/layers/width_norm.h"

#include "kernels/base/error.h"

namespace trident {

void WidthNorm::declare_parameters(ParameterDeclarations& d) {
  tp_rank_ = d.tp_rank();
  tp_ = d.tp_size();
  weight_ = d.add({.name = name_ + ".weight", .shape = {W_}, .init = Init::ones, .summed_over = kDataParallel | AxisSet{MeshAxis::tp}});
}

void WidthNorm::declare_activations(ActivationDeclarations& a, int heads, int column, int row_width) {
  width_ = heads * hd_;
  column_ = column;
  row_width_ = row_width;
  const int pieces = W_ / width_;
  check(pieces * width_ == W_ && tp_ % pieces == 0, "a width norm's heads do not split over tp");
  holders_ = tp_ / pieces;
  const size_t BT = a.shape().tokens();
  input_ = a.keep(BT * W_, Element::act, Retention::dropped_by_full);
  rstd_ = a.keep(BT, Element::f32, Retention::dropped_by_full);
  if (a.shape().deferred_weight_gradients) stash_ = a.keep(width_, Element::f32);
  if (tp_ > 1) a.scratch(gathered_, "width norm gathered", static_cast<size_t>(tp_) * BT * width_, Element::act);
  a.scratch(a_, "width norm a", BT * W_, Element::act);
  a.scratch(b_, "width norm b", BT * W_, Element::act);
  a.scratch(dweight_, "width norm d gain", W_, Element::f32);
}

void WidthNorm::gather_rows(LayerRuntime& r, int BT, const Act* columns, Act* whole, bool sum_holders) const {
  if (tp_ == 1) return r.k.copy_columns(whole, W_, columns, row_width_, BT, W_);
  const kernels::DType type = r.k.activation_type();
  const size_t block = static_cast<size_t>(BT) * width_;
  auto block_of = [&](int rank) { return kernels::offset(gathered_, rank * block, type); };
  r.k.copy_columns(block_of(tp_rank_), width_, columns, row_width_, BT, width_);
  r.tp().communicator()->all_gather(ActivationSpan{gathered_, tp_ * block, type});
  for (int piece = 0; piece < tp_ / holders_; piece++) {
    Act* first = block_of(piece * holders_);
    if (sum_holders)
      for (int h = 1; h < holders_; h++) r.k.add(first, first, block_of(piece * holders_ + h), block);
    r.k.copy_columns(kernels::offset(whole, static_cast<size_t>(piece) * width_, type), W_, first, width_, BT, width_);
  }
}

void WidthNorm::forward(LayerRuntime& r, const Pass& p, Act* qkv) const {
  const int BT = p.B * r.T;
  const kernels::DType type = r.k.activation_type();
  Act* columns = kernels::offset(qkv, column_, type);
  Act* input = r.kept(p.slot, input_);
  gather_rows(r, BT, columns, input, /*sum_holders=*/false);
  r.k.rmsnorm_forward(a_, r.kept<float>(p.slot, rstd_), input, r.weight(weight_), BT, W_, eps_);
  const size_t mine = static_cast<size_t>(tp_rank_ / holders_) * width_;  // this rank's columns of the whole rows
  r.k.copy_columns(columns, row_width_, kernels::offset(a_, mine, type), W_, BT, width_);
}

void WidthNorm::backward(LayerRuntime& r, const Pass& p, Act* dqkv) const {
  const int BT = p.B * r.T;
  const kernels::DType type = r.k.activation_type();
  Act* columns = kernels::offset(dqkv, column_, type);
  gather_rows(r, BT, columns, a_, /*sum_holders=*/true);  // d loss / d output, whole rows
  r.k.fill_zero(b_, r.k.activation_bytes(static_cast<size_t>(BT) * W_));  // the kernel adds into it
  r.k.fill_zero(dweight_, W_ * sizeof(float));
  r.k.rmsnorm_backward(b_, dweight_, a_, r.kept(p.slot, input_), r.weight(weight_), r.kept<float>(p.slot, rstd_), BT,
                       W_);
  const size_t mine = static_cast<size_t>(tp_rank_ / holders_) * width_;
  if (!holds_gradient()) r.k.fill_zero(b_, r.k.activation_bytes(static_cast<size_t>(BT) * W_));
  r.k.copy_columns(columns, row_width_, kernels::offset(b_, mine, type), W_, BT, width_);
  if (!holds_gradient()) return;
  if (p.defer)
    r.k.copy_on_device(r.kept<float>(p.slot, stash_), dweight_ + mine, width_ * sizeof(float));
  else
    r.k.add_f32(r.grad(weight_) + mine, dweight_ + mine, width_);
}

void WidthNorm::weight_gradients(LayerRuntime& r, const Pass& p) const {
  if (!holds_gradient()) return;
  const size_t mine = static_cast<size_t>(tp_rank_ / holders_) * width_;
  r.k.add_f32(r.grad(weight_) + mine, r.kept<float>(p.slot, stash_), width_);
}

}  // namespace trident
