#include "model/layers/head.h"

#include <algorithm>

#include "kernels/base/error.h"

namespace trident {

void Head::declare_parameters(ParameterDeclarations& d) {
  const int tp = d.tp_size();
  const int64_t padded = (static_cast<int64_t>(o_.vocab) + 64 * tp - 1) / (64 * tp) * (64 * tp);
  if (o_.tied) {
    table_ = d.find(o_.table);  // the embedding's (or its copy on this stage), declared first
    check(table_ >= 0, "a tied head without the token table " + o_.table);
  } else {
    table_ = d.add({.name = o_.table,
                    .shape = {o_.vocab, o_.d_model},
                    .sharding = Sharding::rows,
                    .pieces = tp,
                    .init = Init::normal,
                    .padded_rows = padded});
  }
  vocab_shard_ = static_cast<int>(padded / tp);
  vocab_start_ = d.tp_rank() * vocab_shard_;
  vocab_valid_ = std::clamp(o_.vocab - vocab_start_, 0, vocab_shard_);
}

void Head::declare_activations(ActivationDeclarations& a) {
  const size_t BT = a.shape().tokens();
  targets_ = a.keep(BT, Element::i32);
  logits_ = a.keep(BT * vocab_shard_, Element::act);
  losses_ = a.keep(BT, Element::f32);
  row_max_ = a.keep(BT, Element::f32);
  sum_and_target_ = a.keep(2 * BT, Element::f32);
  lse_ = a.keep(BT, Element::f32);
  a.scratch(dinput_, "d norm", BT * o_.d_model, Element::act);
  a.gemm(BT, o_.d_model, vocab_shard_);
}

void Head::load(LayerRuntime& r, const Pass& p, const int32_t* targets) {
  r.k.upload(r.kept<int32_t>(p.slot, targets_), targets, static_cast<size_t>(p.B) * r.T * sizeof(int32_t));
}

void Head::forward(LayerRuntime& r, const Pass& p, const Act* in) const {
  const int BT = p.B * r.T, C = o_.d_model;
  Act* logits = r.kept(p.slot, logits_);
  float *row_max = r.kept<float>(p.slot, row_max_), *sums = r.kept<float>(p.slot, sum_and_target_);
  float *losses = r.kept<float>(p.slot, losses_), *lse = r.kept<float>(p.slot, lse_);
  r.k.matmul_forward(logits, r.regions.gathered_rows(in, p.B), r.weight(table_), nullptr, BT, C, vocab_shard_);
  r.k.logits_row_max(row_max, logits, BT, vocab_valid_, vocab_shard_);
  r.tp().max_over_vocab_shards(row_max, BT);
  r.k.logits_sum_exp_and_target(sums, logits, row_max, r.kept<int32_t>(p.slot, targets_), vocab_start_, BT,
                                vocab_valid_, vocab_shard_);
  r.tp().sum_over_vocab_shards(sums, 2 * static_cast<size_t>(BT));
  r.k.cross_entropy_loss(losses, lse, row_max, sums, BT);
  r.k.accumulate_sum(r.loss_sum, losses, BT);  // read once per step
}

const kernels::Act* Head::backward(LayerRuntime& r, const Pass& p, float loss_scale, const Act* in) const {
  const int BT = p.B * r.T, C = o_.d_model;
  Act* logits = r.kept(p.slot, logits_);  // becomes d logits in place
  r.k.cross_entropy_backward(logits, r.kept<float>(p.slot, lse_), r.kept<int32_t>(p.slot, targets_), vocab_start_, BT,
                             vocab_valid_, vocab_shard_, loss_scale);
  r.k.matmul_backward(dinput_, p.defer ? nullptr : r.grad(table_), nullptr, logits,
                      p.defer ? nullptr : r.regions.gathered_rows(in, p.B), r.weight(table_), BT, C, vocab_shard_);
  return r.regions.reduce_gradient_rows(dinput_, p.B);
}

void Head::weight_gradients(LayerRuntime& r, const Pass& p, const Act* in) const {
  r.k.matmul_backward(nullptr, r.grad(table_), nullptr, r.kept(p.slot, logits_), r.regions.gathered_rows(in, p.B),
                      nullptr, p.B * r.T, o_.d_model, vocab_shard_);
}

const kernels::Act* Head::logits(const LayerRuntime& r, int slot, size_t row) const {
  return kernels::offset(r.kept(slot, logits_), row * vocab_shard_, r.k.activation_type());
}

}  // namespace trident
