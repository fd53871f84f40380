#include "model/layers/attention.h"

#include "kernels/base/error.h"
#include "model/layers/head_norm.h"
#include "model/layers/width_norm.h"

namespace trident {

namespace {

// The column-parallel projection's parts: fused (q, k, v cut together by heads) or apart
// (key/value heads cut into as many pieces as there are, when fewer than tp).
std::vector<ColumnParallelLinear::Part> qkv_parts(const AttentionOptions& o, int tp) {
  const int64_t q_rows = static_cast<int64_t>(o.n_head) * o.head_dim;
  const int64_t kv_rows = static_cast<int64_t>(o.n_kv_head) * o.head_dim;
  if (o.qkv.size() == 1) {
    check(o.n_kv_head == o.n_head, "a fused q, k, v projection with fewer key/value heads");
    return {{o.qkv[0], 3 * q_rows, tp, Sharding::qkv_rows}};
  }
  check(o.qkv.size() == 3, "attention's projection is q | k | v fused, or q, k and v");
  const int kv_pieces = tp <= o.n_kv_head ? tp : o.n_kv_head;
  return {{o.qkv[0], q_rows, tp}, {o.qkv[1], kv_rows, kv_pieces}, {o.qkv[2], kv_rows, kv_pieces}};
}

// The q/k norm slot's norm of `heads` heads (none: null).
std::unique_ptr<QkNorm> qk_norm(const AttentionOptions& o, const std::string& name, int heads) {
  switch (o.qk_norm) {
    case QkNormKind::none: return nullptr;
    case QkNormKind::per_head: return std::make_unique<HeadNorm>(name, o.head_dim, o.norm_eps);
    case QkNormKind::full_width: return std::make_unique<WidthNorm>(name, heads, o.head_dim, o.norm_eps);
  }
  return nullptr;
}

}  // namespace

Attention::Attention(AttentionOptions o)
    : o_(std::move(o)), qkv_({}, o_.d_model, o_.qkv_bias),
      out_(o_.out, o_.d_model, o_.n_head * o_.head_dim, o_.out_bias) {
  q_norm_ = qk_norm(o_, o_.q_norm, o_.n_head);
  k_norm_ = qk_norm(o_, o_.k_norm, o_.n_kv_head);
}

void Attention::declare_parameters(ParameterDeclarations& d) {
  const int tp = d.tp_size();
  qkv_ = ColumnParallelLinear(qkv_parts(o_, tp), o_.d_model, o_.qkv_bias);
  qkv_.declare_parameters(d);
  if (q_norm_) q_norm_->declare_parameters(d);
  if (k_norm_) k_norm_->declare_parameters(d);
  out_.declare_parameters(d);
  heads_local_ = o_.n_head / tp;
  kv_heads_local_ = o_.n_kv_head / (tp <= o_.n_kv_head ? tp : o_.n_kv_head);
}

void Attention::declare_activations(ActivationDeclarations& a) {
  const ActivationShape& s = a.shape();
  const size_t BT = s.tokens();
  const int width = out_.in_local();  // this rank's heads of the output: heads_local_ * head_dim
  const size_t stats = s.footprint->attention_stats_floats(s.micro_batch, s.seq_len, heads_local_);
  qkv_buffer_ = a.keep(BT * qkv_.out_local(), Element::act, Retention::dropped_by_full);
  atty_buffer_ = a.keep(BT * width, Element::act, Retention::dropped_by_selective);
  stats_buffer_ = a.keep(stats, Element::f32, Retention::dropped_by_selective);
  a.scratch(dinput_, "d norm", BT * o_.d_model, Element::act);
  a.scratch(datty_, "d attention out", BT * width, Element::act);
  a.scratch(dqkv_, "d qkv", BT * qkv_.out_local(), Element::act);
  const int q_width = heads_local_ * o_.head_dim;  // a qkv row: q | k v
  if (q_norm_) q_norm_->declare_activations(a, heads_local_, 0, qkv_.out_local());
  if (k_norm_) k_norm_->declare_activations(a, kv_heads_local_, q_width, qkv_.out_local());
  if (s.context_parallel > 1) {
    int ring = 0;  // each of the ring's buffers its own name, shared by every layer
    ring_buffers_.lay_out(
        BT, qkv_.out_local(), width, stats,
        [&](Act*& p, size_t n) { a.scratch(p, "ring " + std::to_string(ring++), n, Element::act); },
        [&](float*& p, size_t n) { a.scratch(p, "ring " + std::to_string(ring++), n, Element::f32); });
  }
  a.gemm(BT, o_.d_model, qkv_.out_local());
  a.gemm(BT, width, o_.d_model);
}

void Attention::attach(AttentionContext& context) {
  rotary_table_ = o_.rotary ? context.rotary_table(*o_.rotary) : nullptr;
  ring_ = context.ring(heads_local_, kv_heads_local_, o_.head_dim);
  masks_ = &context.masks(o_.window);
}

void Attention::core_forward(LayerRuntime& r, const Pass& p) const {
  Act* atty = r.kept(p.slot, atty_buffer_);
  float* stats = r.kept<float>(p.slot, stats_buffer_);
  const Act* qkv = r.kept(p.slot, qkv_buffer_);
  const kernels::AttentionMask mask = masks_->at(p.slot);
  if (ring_ != nullptr) return ring_->forward(atty, stats, qkv, mask, p.B, ring_buffers_);
  const int hd = o_.head_dim;
  const Act* kv = kernels::offset(qkv, static_cast<size_t>(heads_local_) * hd, r.k.activation_type());  // q | k v
  r.k.attention_forward(atty, stats, qkv, kv, qkv_.out_local(), mask, p.B, r.T, r.T, heads_local_, kv_heads_local_,
                        hd);
}

void Attention::forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed) {
  check(masks_ != nullptr, "attention run before its stage attached it to the attention context");
  Act* qkv = r.kept(p.slot, qkv_buffer_);
  qkv_.forward(r, p.B, in, qkv);
  if (q_norm_) q_norm_->forward(r, p, qkv);
  if (k_norm_) k_norm_->forward(r, p, qkv);
  if (rotary_table_ != nullptr) r.k.rope_forward(qkv, rotary_table_, p.B, r.T, heads_local_, kv_heads_local_, o_.head_dim);
  core_forward(r, p);
  r.store.progress_gathers();
  if (output_needed) out_.forward(r, p.B, r.kept(p.slot, atty_buffer_), out);
}

const kernels::Act* Attention::backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) {
  Act* qkv = r.kept(p.slot, qkv_buffer_);
  const Act* atty = r.kept(p.slot, atty_buffer_);
  const float* stats = r.kept<float>(p.slot, stats_buffer_);
  out_.backward(r, p, dout, atty, datty_, out);
  const int hd = o_.head_dim;
  const kernels::DType type = r.k.activation_type();
  const size_t kv_column = static_cast<size_t>(heads_local_) * hd;  // a qkv row: q | k v
  const kernels::AttentionMask mask = masks_->at(p.slot);
  if (ring_ != nullptr)
    ring_->backward(dqkv_, datty_, qkv, atty, stats, mask, p.B, ring_buffers_);
  else
    r.k.attention_backward(dqkv_, kernels::offset(dqkv_, kv_column, type), datty_, qkv,
                           kernels::offset(qkv, kv_column, type), qkv_.out_local(), atty, stats, mask, p.B, r.T,
                           r.T, heads_local_, kv_heads_local_, hd);
  if (rotary_table_ != nullptr) r.k.rope_backward(dqkv_, rotary_table_, p.B, r.T, heads_local_, kv_heads_local_, hd);
  if (k_norm_) k_norm_->backward(r, p, dqkv_);
  if (q_norm_) q_norm_->backward(r, p, dqkv_);
  // Deferred: the projection's output gradient waits in its output buffer (no longer needed).
  if (p.defer) r.k.copy_on_device(qkv, dqkv_, r.k.activation_bytes(static_cast<size_t>(p.B) * r.T * qkv_.out_local()));
  return qkv_.backward(r, p, dqkv_, in, dinput_);
}

void Attention::weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) {
  out_.weight_gradients(r, p.B, r.kept(p.slot, atty_buffer_), out);
  qkv_.weight_gradients(r, p.B, r.kept(p.slot, qkv_buffer_), in);
  if (k_norm_) k_norm_->weight_gradients(r, p);
  if (q_norm_) q_norm_->weight_gradients(r, p);
}

}  // namespace trident
