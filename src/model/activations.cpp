#include "model/activations.h"

#include <utility>

#include "kernels/base/error.h"

namespace trident {

ActivationArena::ActivationArena(const ActivationShape& shape, kernels::Kernels& k) : ActivationArena(shape, &k) {}

ActivationBytes ActivationArena::measure(const ActivationShape& shape) {
  return ActivationArena(shape, nullptr).bytes();
}

// First every buffer is listed with its size and part, then (given a backend) one
// allocation is cut into them: every page is touched once, at start. Activations take
// the backend's type, statistics fp32, each buffer 64-byte aligned.
ActivationArena::ActivationArena(const ActivationShape& shape, kernels::Kernels* k) : shape_(shape) {
  using Act = kernels::Act;
  const ActivationShape& s = shape;
  check(s.micro_batch > 0 && s.slots > 0, "micro_batch and slots must be positive");
  check(!s.deferred_weight_gradients || s.recompute == Recompute::none,
        "deferred weight gradients need the activations kept (no recompute)");
  const size_t BT = static_cast<size_t>(s.micro_batch) * s.seq_len, C = s.d_model;
  check(s.sequence_shards > 0 && BT % s.sequence_shards == 0, "sequence shards must divide the micro-batch's rows");
  const size_t R = BT / s.sequence_shards;  // this rank's rows of the residual stream
  std::vector<std::pair<void**, size_t>> plan;
  size_t* part = nullptr;  // where the next buffers' bytes are counted
  const auto want_bytes = [&](void** p, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    plan.emplace_back(p, bytes);
    *part += bytes;
  };
  const auto want = [&](Act*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), s.act_bytes(n)); };
  const auto want_f32 = [&](float*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), n * sizeof(float)); };
  const auto want_i32 = [&](int32_t*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), n * sizeof(int32_t)); };

  // One layer's buffers; `keep` says which of them this set holds (the others alias the
  // shared recompute set).
  const auto want_layer = [&](LayerActivations& a, bool keep_attention_core, bool keep_rest, bool keep_output) {
    if (keep_rest) {
      want(a.norm_1, R * C);
      if (s.layernorm) want_f32(a.norm_1_mean, R);
      want_f32(a.norm_1_rstd, R);
      want(a.qkv, BT * s.qkv_width);
    }
    if (keep_attention_core) {
      want(a.atty, BT * s.attention_width);
      want_f32(a.attention_stats, s.attention_stats_floats);
    }
    if (keep_rest) {
      want(a.residual_2, R * C);
      want(a.norm_2, R * C);
      if (s.layernorm) want_f32(a.norm_2_mean, R);
      want_f32(a.norm_2_rstd, R);
      want(a.fc, BT * s.mlp_in);
      want(a.fc_act, BT * s.ffn);
    }
    if (keep_output) want(a.residual_3, R * C);
    if (keep_output && s.deferred_weight_gradients) want_f32(a.norm_gradients, 4 * C);
  };
  const bool keep_core = s.recompute == Recompute::none, keep_rest = s.recompute != Recompute::full;

  slots.resize(s.slots);
  part = &bytes_.slots;
  for (SlotActivations& slot : slots) {
    want_i32(slot.tokens, BT);
    want_i32(slot.targets, BT);
    want(slot.encoded, R * C);
    slot.layers.resize(s.layers);
    for (LayerActivations& a : slot.layers) want_layer(a, keep_core, keep_rest, /*keep_output=*/true);
    if (s.has_head) {
      want(slot.final_norm, R * C);
      if (s.layernorm) want_f32(slot.final_norm_mean, R);
      want_f32(slot.final_norm_rstd, R);
      want(slot.logits, BT * s.vocab_shard);
      want_f32(slot.losses, BT);
      want_f32(slot.row_max, BT);
      want_f32(slot.sum_and_target, 2 * BT);
      want_f32(slot.lse, BT);
      if (s.deferred_weight_gradients) want_f32(slot.final_norm_gradients, 2 * C);
    }
  }
  bytes_.per_slot = bytes_.slots / s.slots;
  part = &bytes_.recompute;
  if (s.recompute != Recompute::none && s.layers > 0) want_layer(recompute, !keep_core, !keep_rest, false);
  part = &bytes_.backward;
  want(scratch.dresidual, R * C);
  if (s.sends_gradients) want(scratch.sent_gradient, R * C);
  want(scratch.dnorm, BT * C);
  want(scratch.datty, BT * s.attention_width);
  want(scratch.dqkv, BT * s.qkv_width);
  want(scratch.dfc, BT * s.mlp_in);
  // GELU's backward runs in place; SwiGLU's reads d(activation) [BT, ffn] and writes
  // d(gate | up) [BT, 2 ffn], so it needs a buffer of its own.
  if (s.swiglu) want(scratch.dfc_act, BT * s.ffn);
  if (s.sequence_shards > 1) {
    want(scratch.gathered, BT * C);
    want(scratch.dnorm_rows, R * C);
  }
  if (s.context_parallel > 1)
    scratch.ring.lay_out(BT, s.qkv_width, s.attention_width, s.attention_stats_floats, want, want_f32);
  if (k == nullptr) return;

  memory_ = kernels::DeviceBuffer(*k, bytes_.total() / sizeof(float));
  char* next = reinterpret_cast<char*>(memory_.data());
  for (auto& [ptr, bytes] : plan) {
    *ptr = next;
    next += bytes;
  }
  if (!s.swiglu) scratch.dfc_act = scratch.dfc;
  // The layers that do not keep a buffer use the shared set's.
  for (SlotActivations& slot : slots)
    for (LayerActivations& a : slot.layers) {
      kernels::Act* output = a.residual_3;
      float* norm_gradients = a.norm_gradients;
      if (!keep_rest) a = recompute;
      else if (!keep_core) a.atty = recompute.atty, a.attention_stats = recompute.attention_stats;
      a.residual_3 = output;
      a.norm_gradients = norm_gradients;
    }
}

}  // namespace trident
