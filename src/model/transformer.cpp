#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "model/document_mask.h"
#include "monitor/step_trace.h"
#include "kernels/base/error.h"
#include "runtime/random.h"

namespace trident {

ActivationShape activation_shape(const ParameterLayout& layout, int micro_batch, int slots, Recompute recompute,
                                 const kernels::Footprint& k, int sequence_shards, bool split_backward,
                                 int context_parallel) {
  const TransformerSpec& s = layout.spec();
  const int tp = layout.tp_size();
  const int heads = s.n_head / tp, kv_heads = s.n_kv_head / s.kv_shards(tp);
  ActivationShape a;
  a.micro_batch = micro_batch;
  a.seq_len = s.seq_len / context_parallel;  // this rank's tokens of a sequence
  a.context_parallel = context_parallel;
  a.d_model = s.d_model;
  a.qkv_width = (heads + 2 * kv_heads) * s.head_dim;
  a.attention_width = heads * s.head_dim;
  a.ffn = s.mlp_activation_width(tp);
  a.mlp_in = s.mlp_in_width(tp);
  a.vocab_shard = s.padded_vocab(tp) / tp;
  a.layers = layout.layers();
  a.layernorm = s.norm == NormKind::layernorm;
  a.swiglu = s.mlp == MlpKind::swiglu;
  a.has_head = layout.head() >= 0 && layout.final_norm_weight() >= 0;
  a.slots = slots;
  a.recompute = recompute;
  a.act_type = k.activation_type();
  a.attention_stats_floats = k.attention_stats_floats(micro_batch, a.seq_len, heads);
  a.sequence_shards = sequence_shards;
  a.deferred_weight_gradients = split_backward && recompute == Recompute::none;
  a.sends_gradients = layout.token_embedding() < 0 || layout.chunks() > 1;  // not the whole model from the embedding
  return a;
}

Transformer::Transformer(const ModelConfig& config, kernels::Kernels& k, const TransformerOptions& options)
    : stage_(options.stage), tp_(options.tp),
      layout_(transformer_spec(config), tp_.rank(), tp_.size(), options.buffer_multiple, options.stage),
      B_(options.micro_batch), k_(k), store_(layout_, k, options.zero, options.shard_group),
      act_type_(k.activation_type()),
      activations_(activation_shape(layout_, B_, options.slots, options.recompute, k,
                                    tp_.sequence_parallel() ? tp_.size() : 1, options.split_backward,
                                    options.context_parallel != nullptr ? options.context_parallel->size() : 1),
                   k) {
  const TransformerSpec& s = spec();
  const TensorParallel& tp = tp_;
  heads_local_ = s.n_head / tp.size();
  kv_heads_local_ = s.n_kv_head / s.kv_shards(tp.size());
  qkv_width_ = (heads_local_ + 2 * kv_heads_local_) * s.head_dim;
  attention_width_ = heads_local_ * s.head_dim;
  ffn_local_ = s.mlp_activation_width(tp.size());
  vocab_shard_ = s.padded_vocab(tp.size()) / tp.size();
  vocab_start_ = tp.rank() * vocab_shard_;
  vocab_valid_ = std::clamp(s.vocab_size - vocab_start_, 0, vocab_shard_);
  // This rank's tokens of each sequence, and (the ring's key blocks) every cp rank's.
  Communicator* cp = options.context_parallel;
  cp_ = cp != nullptr ? cp->size() : 1;
  T_ = s.seq_len / cp_;
  const std::vector<int32_t> every_rank = context_positions_of_every_rank(s.seq_len, cp_);
  cp_rank_ = cp != nullptr ? cp->rank() : 0;
  host_positions_ = context_positions(s.seq_len, cp_, cp_rank_);
  positions_ = kernels::DeviceBuffer(k, every_rank.size());
  k.copy_to_device(positions_.data(), every_rank.data(), every_rank.size() * sizeof(int32_t));
  if (cp_ > 1) {
    ring_ = std::make_unique<RingAttention>(k, *cp, reinterpret_cast<const int32_t*>(positions_.data()), T_,
                                            heads_local_, kv_heads_local_, s.head_dim);
    my_tokens_.resize(static_cast<size_t>(B_) * T_);
    my_targets_.resize(my_tokens_.size());
  }
  if (s.positions == PositionKind::rotary) {  // the rows of this rank's positions
    const std::vector<float> table = rope_table(s);
    const size_t row = table.size() / s.seq_len;
    std::vector<float> mine;
    for (int32_t p : host_positions_) mine.insert(mine.end(), table.begin() + p * row, table.begin() + (p + 1) * row);
    rope_table_ = kernels::DeviceBuffer(k, mine.size());
    k.copy_to_device(rope_table_.data(), mine.data(), mine.size() * sizeof(float));
  }
  loss_sum_ = kernels::DeviceBuffer(k, 2);  // one double
  document_end_ = options.document_end;
  if (document_end_ >= 0) {
    host_document_starts_.resize(static_cast<size_t>(B_) * s.seq_len);
    my_document_starts_.resize(static_cast<size_t>(B_) * T_);
    document_starts_ = kernels::DeviceBuffer(k, my_document_starts_.size() * options.slots);
  }
  host_tokens_.resize(options.slots);
  // The kernels' workspace for these shapes now, as the memory plan counts it.
  k.reserve_workspace(B_ * T_, s.d_model, activations_.shape().widest_output(), B_, T_, heads_local_);
}

void Transformer::init_parameters(uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * spec().n_layer);
  const ShardedParameters view = store_.parameters();
  std::vector<float> staging;  // one shard, where the parameters are not host memory
  for (const auto& t : layout_.tensors()) {  // of this stage
    // Each element from its canonical index, straight into this rank's shard: the same
    // values under any tp, and no full copy of a large tensor (the embedding) in memory.
    const bool normal = t.init == Init::normal || t.init == Init::normal_residual;
    const double std = 0.02 * (t.init == Init::normal_residual ? residual_scale : 1.0);
    const float constant = t.init == Init::ones ? 1.0f : 0.0f;
    const uint64_t stream = hash_name(t.name);
    const auto values = [&](int64_t first, int64_t n, float* out) {
      for (int64_t i = 0; i < n; i++)
        out[i] = normal ? static_cast<float>(std * normal_at(seed, stream, static_cast<uint64_t>(first + i))) : constant;
    };
    float* shard = view.host_shard(t);
    if (shard == nullptr) {
      staging.resize(t.stored);
      shard = staging.data();
    }
    layout_.shard_into(t, values, shard);
    if (shard == staging.data()) view.set_shard(t, shard);
  }
  store_.parameters_changed();
}

void Transformer::set_parameter(const std::string& name, const float* host, size_t count) {
  const ParameterTensor& t = layout_.tensor(name);
  require(count == t.numel(), "parameter " + name + " has " + std::to_string(t.numel()) +
                                  " elements, got " + std::to_string(count));
  store_.parameters().set(t, host);
  store_.parameters_changed();
}

std::vector<float> Transformer::full_parameter(const std::string& name) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, store_.parameter_to_host(static_cast<int>(&t - layout_.tensors().data())));
}

std::vector<float> Transformer::full_gradient(const std::string& name) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, store_.gradient_to_host(static_cast<int>(&t - layout_.tensors().data())));
}

std::vector<float> Transformer::tensor_from_host(const std::string& name, const float* flat) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, std::vector<float>(flat + t.offset, flat + t.offset + t.stored));
}

std::vector<float> Transformer::assemble_over_tp(const ParameterTensor& t, const std::vector<float>& mine) {
  if (t.shards == 1) return layout_.assemble(t, mine);
  // Every tp rank's copy, then one per piece (its first holder's).
  std::vector<float> all(t.stored * tp_.size()), pieces(t.stored * t.shards);
  std::copy(mine.begin(), mine.end(), all.begin() + tp_.rank() * t.stored);
  tp_.communicator()->all_gather(all);
  const int holders = tp_.size() / t.shards;
  for (int p = 0; p < t.shards; p++)
    std::copy_n(all.begin() + static_cast<size_t>(p) * holders * t.stored, t.stored, pieces.begin() + p * t.stored);
  return layout_.assemble(t, pieces);
}

ActivationSpan Transformer::gradient_to_send(int B) {
  const BackwardScratch& d = activations_.scratch;
  check(d.sent_gradient != nullptr, "gradient_to_send() on a stage that sends no gradient");
  k_.copy_on_device(d.sent_gradient, d.dresidual, rows_of(d.dresidual, B).bytes());
  return rows_of(d.sent_gradient, B);
}

kernels::AttentionMask Transformer::attention_mask(int slot) const {
  const int32_t* every_rank = reinterpret_cast<const int32_t*>(positions_.data());
  const int32_t* mine = every_rank + static_cast<size_t>(cp_rank_) * T_;
  const int32_t* starts = document_end_ < 0 ? nullptr
                                            : reinterpret_cast<const int32_t*>(document_starts_.data()) +
                                                  static_cast<size_t>(slot) * B_ * T_;
  return {mine, mine, starts};
}

kernels::Act* Transformer::layer_input(int slot, int l) const {
  return l == 0 ? activations_.slots[slot].encoded : activations_.slots[slot].layers[l - 1].residual_3;
}

void Transformer::norm_forward(Act* out, float* mean, float* rstd, const Act* inp, int weight_index, int bias_index,
                               int N) {
  const int C = spec().d_model;
  const float eps = static_cast<float>(spec().norm_eps);
  if (spec().norm == NormKind::layernorm)
    k_.layernorm_forward(out, mean, rstd, inp, weight(weight_index), weight(bias_index), N, C, eps);
  else
    k_.rmsnorm_forward(out, rstd, inp, weight(weight_index), N, C, eps);
}

void Transformer::norm_backward(Act* dinp, int weight_index, float* dweight, float* dbias, const Act* dout,
                                const Act* inp, const float* mean, const float* rstd, int N) {
  const int C = spec().d_model;
  if (spec().norm == NormKind::layernorm)
    k_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight(weight_index), mean, rstd, N, C);
  else
    k_.rmsnorm_backward(dinp, dweight, dout, inp, weight(weight_index), rstd, N, C);
}

void Transformer::forward(int slot, const int32_t* tokens, const int32_t* targets, int B) {
  check(chunks() == 1, "forward(slot, ...) on a stage of several chunks: chunk_forward()");
  chunk_forward(0, slot, tokens, targets, B);
}

void Transformer::chunk_forward(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int B) {
  check(B > 0 && B <= B_, "forward: batch " + std::to_string(B) + " exceeds the micro-batch " +
                              std::to_string(B_));
  Slot& s = activations_.slots.at(slot);
  const int T = T_, C = spec().d_model, V = spec().vocab_size, BT = B * T, seq_len = spec().seq_len;
  for (int i = 0; i < B * seq_len; i++)  // the message is built only on failure (this runs for every token)
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw UsageError("token id out of range [0, " + std::to_string(V) + ") at position " + std::to_string(i));
  // Documents are found in whole sequences (every stage has the tokens), then each rank
  // keeps its share of everything (context parallelism: its chunks of each sequence).
  const int32_t* starts = host_document_starts_.data();
  if (document_end_ >= 0) document_starts(tokens, B, seq_len, document_end_, host_document_starts_.data());
  if (cp_ > 1) {
    take_positions(tokens, B, seq_len, host_positions_, my_tokens_.data());
    take_positions(targets, B, seq_len, host_positions_, my_targets_.data());
    tokens = my_tokens_.data();
    targets = my_targets_.data();
    if (document_end_ >= 0) {
      take_positions(host_document_starts_.data(), B, seq_len, host_positions_, my_document_starts_.data());
      starts = my_document_starts_.data();
    }
  }
  // Without waiting for the device: the first stage embeds the tokens (and keeps the
  // host's copy for the embedding's backward), the last scores the targets.
  if (embeds(chunk)) {
    k_.upload(s.tokens, tokens, BT * sizeof(int32_t));
    host_tokens_.at(slot).assign(tokens, tokens + BT);
  }
  if (has_head(chunk)) k_.upload(s.targets, targets, BT * sizeof(int32_t));
  if (document_end_ >= 0)
    k_.upload(document_starts_.data() + static_cast<size_t>(slot) * B_ * T, starts, BT * sizeof(int32_t));
  s.B = B;
  store_.refresh_weights();

  if (embeds(chunk)) {
    // Vocabulary-parallel embedding: each token's row comes from the shard that owns it.
    const int wpe = layout_.position_embedding();
    if (tp_.sequence_parallel()) {
      // The partial sums of all rows, positions added once (rank 0), each rank's rows summed.
      Act* partial = activations_.scratch.gathered;
      k_.embedding_forward(partial, s.tokens, weight(layout_.token_embedding()), vocab_start_, vocab_shard_, B, T, C);
      if (wpe >= 0 && tp_.rank() == 0) k_.add_positions(partial, weight(wpe), attention_mask(slot).q_pos, B, T, C);
      tp_.scatter_sequence(hidden(partial, B), rows_of(s.encoded, B));
    } else {
      k_.embedding_forward(s.encoded, s.tokens, weight(layout_.token_embedding()), vocab_start_, vocab_shard_, B, T,
                           C);
      tp_.sum_embedding_shards(hidden(s.encoded, B));
      if (wpe >= 0) k_.add_positions(s.encoded, weight(wpe), attention_mask(slot).q_pos, B, T, C);
    }
  }
  for (int l = layout_.chunk_begin(chunk); l < layout_.chunk_begin(chunk + 1); l++) {
    store_.use_block(l, l + 1);  // ZeRO-3: its weights gathered, the next block's on their way
    const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.global_layer(l)) + " forward"; });
    block_forward(s, slot, l);
  }
  if (!has_head(chunk)) return;
  norm_forward(s.final_norm, s.final_norm_mean, s.final_norm_rstd, layer_input(slot, layout_.layers()),
               layout_.final_norm_weight(), layout_.final_norm_bias(), rows(B));
  // Vocabulary-parallel head (GPT-2: the tied wte): this rank's logits are
  // norm(x) @ head_shard^T; the softmax over the whole vocabulary is assembled from
  // per-shard partials.
  k_.matmul_forward(s.logits, gathered_rows(s.final_norm, B), weight(layout_.head()), nullptr, BT, C, vocab_shard_);
  k_.logits_row_max(s.row_max, s.logits, BT, vocab_valid_, vocab_shard_);
  tp_.max_over_vocab_shards(s.row_max, BT);
  k_.logits_sum_exp_and_target(s.sum_and_target, s.logits, s.row_max, s.targets, vocab_start_, BT, vocab_valid_,
                               vocab_shard_);
  tp_.sum_over_vocab_shards(s.sum_and_target, 2 * static_cast<size_t>(BT));
  k_.cross_entropy_loss(s.losses, s.lse, s.row_max, s.sum_and_target, BT);
  k_.accumulate_sum(loss_sum(), s.losses, BT);  // read once per step: take_loss_sum()
}

double Transformer::take_loss_sum() {
  if (!stage_.has_head) return 0.0;
  double sum = 0.0;
  k_.copy_to_host(&sum, loss_sum(), sizeof sum);
  discard_loss_sum();
  return sum;
}

void Transformer::discard_loss_sum() {
  if (stage_.has_head) k_.fill_zero(loss_sum(), sizeof(double));
}

float Transformer::forward(const int32_t* tokens, const int32_t* targets, int B) {
  discard_loss_sum();
  forward(0, tokens, targets, B);
  return static_cast<float>(take_loss_sum() / (static_cast<double>(B) * T_));
}

std::vector<float> Transformer::logits(int slot, int b, int t) {
  const Slot& s = activations_.slots.at(slot);
  check(stage_.has_head && b < s.B && t < spec().seq_len && cp_ == 1, "logits: no such row on this stage");
  const size_t row = static_cast<size_t>(b) * spec().seq_len + t;
  std::vector<float> all(static_cast<size_t>(vocab_shard_) * tp_.size());
  k_.activations_to_host(all.data() + static_cast<size_t>(tp_.rank()) * vocab_shard_,
                         kernels::offset(s.logits, row * vocab_shard_, act_type_), vocab_shard_);
  if (tp_.communicator() != nullptr) tp_.communicator()->all_gather(all);
  all.resize(spec().vocab_size);  // the shards in order, padding last
  return all;
}

void Transformer::block_forward(const Slot& s, int slot, int l, bool up_to_mlp) {
  const TransformerSpec& sp = spec();
  const int B = s.B, T = T_, C = sp.d_model, hd = sp.head_dim, BT = B * T, N = rows(B);
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  const Act* residual = layer_input(slot, l);
  const size_t NC = static_cast<size_t>(N) * C;
  // The row-parallel biases are added by one rank, before the sum over tp.
  const bool add_replicated_bias = tp_.rank() == 0;
  // Attention: residual_2 = residual + out(attention(rope(qkv(norm_1(residual)))))
  norm_forward(a.norm_1, a.norm_1_mean, a.norm_1_rstd, residual, p.norm_1_weight, p.norm_1_bias, N);
  k_.matmul_forward(a.qkv, gathered_rows(a.norm_1, B), weight(p.qkv_weight), weight(p.qkv_bias), BT, C,
                    qkv_width_);  // column-parallel
  if (sp.positions == PositionKind::rotary)
    k_.rope_forward(a.qkv, rope_table_.data(), B, T, heads_local_, kv_heads_local_, hd);
  attention_forward(a, slot, B);
  store_.progress_gathers();
  Act* out = row_parallel_output(a.residual_2);
  k_.matmul_forward(out, a.atty, weight(p.attn_out_weight),  // row-parallel
                    add_replicated_bias ? weight(p.attn_out_bias) : nullptr, BT, attention_width_, C);
  reduce_rows(out, a.residual_2, B);
  k_.add(a.residual_2, a.residual_2, residual, NC);
  // MLP: residual_3 = residual_2 + out(act(in(norm_2(residual_2)))), act GELU or SwiGLU
  norm_forward(a.norm_2, a.norm_2_mean, a.norm_2_rstd, a.residual_2, p.norm_2_weight, p.norm_2_bias, N);
  const int mlp_in = sp.mlp_in_width(tp_.size());
  k_.matmul_forward(a.fc, gathered_rows(a.norm_2, B), weight(p.mlp_in_weight), weight(p.mlp_in_bias), BT, C,
                    mlp_in);  // column-parallel
  if (sp.mlp == MlpKind::swiglu) k_.swiglu_forward(a.fc_act, a.fc, BT, ffn_local_);
  else k_.gelu_forward(a.fc_act, a.fc, static_cast<size_t>(BT) * ffn_local_);
  store_.progress_gathers();
  if (up_to_mlp) return;
  out = row_parallel_output(a.residual_3);
  k_.matmul_forward(out, a.fc_act, weight(p.mlp_out_weight),  // row-parallel
                    add_replicated_bias ? weight(p.mlp_out_bias) : nullptr, BT, ffn_local_, C);
  reduce_rows(out, a.residual_3, B);
  k_.add(a.residual_3, a.residual_3, a.residual_2, NC);
}

void Transformer::backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from,
                           const std::function<void(int)>& block_begins) {
  check(chunks() == 1, "backward(slot, ...) on a stage of several chunks: chunk_backward()");
  chunk_backward(0, slot, loss_scale, BackwardPart::whole, grads_final_from, block_begins);
}

void Transformer::chunk_backward(int chunk, int slot, float loss_scale, BackwardPart part,
                                 const std::function<void(size_t)>& grads_final_from,
                                 const std::function<void(int)>& block_begins) {
  const Slot& s = activations_.slots.at(slot);
  check(s.B > 0, "backward() without forward()");
  const auto report = [&](size_t offset) {
    if (grads_final_from) grads_final_from(offset);
  };
  const int first = layout_.chunk_begin(chunk), end = layout_.chunk_begin(chunk + 1);
  const bool defer = part == BackwardPart::input && defers_weight_gradients();
  if (part == BackwardPart::weight) {
    if (!adds_weight_gradients(part)) return;  // the input half did it all
    if (has_head(chunk)) {
      head_weight_gradients(s);
      report(layout_[layout_.final_norm_weight()].offset);
    }
    for (int l = end - 1; l >= first; l--) {
      if (block_begins) block_begins(l);
      const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.global_layer(l)) + " weight gradients"; });
      block_weight_gradients(s, l);
      report(layout_[layout_.block(l).first].offset);
    }
    if (chunk == 0) report(0);
    return;
  }
  const BackwardScratch& d = activations_.scratch;
  const int B = s.B, T = T_, C = spec().d_model, BT = B * T;
  if (has_head(chunk)) {
    // Head: logits become dlogits in place, then through the head and the final norm.
    const int gain = layout_.final_norm_weight(), bias = layout_.final_norm_bias();
    k_.cross_entropy_backward(s.logits, s.lse, s.targets, vocab_start_, BT, vocab_valid_, vocab_shard_, loss_scale);
    k_.matmul_backward(d.dnorm, defer ? nullptr : grad(layout_.head()), nullptr, s.logits,
                       defer ? nullptr : gathered_rows(s.final_norm, B), weight(layout_.head()), BT, C, vocab_shard_);
    const Act* dnorm = reduce_gradient_rows(d.dnorm, B);
    k_.fill_zero(d.dresidual, rows_of(d.dresidual, B).bytes());
    if (defer) k_.fill_zero(s.final_norm_gradients, 2 * C * sizeof(float));
    norm_backward(d.dresidual, gain, defer ? stash(s.final_norm_gradients, 0) : grad(gain),
                  defer ? (bias >= 0 ? stash(s.final_norm_gradients, 1) : nullptr) : grad(bias), dnorm,
                  layer_input(slot, end), s.final_norm_mean, s.final_norm_rstd, rows(B));
    if (!defer) report(layout_[gain].offset);
  }  // else the pipeline put d loss / d output into d.dresidual
  for (int l = end - 1; l >= first; l--) {
    if (block_begins && !defer) block_begins(l);
    store_.use_block(l, l - 1);
    // What the layer did not keep, recomputed into the shared set (model/activations.h).
    if (recompute() == Recompute::full) {
      const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.global_layer(l)) + " recompute"; });
      block_forward(s, slot, l, /*up_to_mlp=*/true);
    } else if (recompute() == Recompute::selective) {
      const LayerActivations& a = s.layers[l];
      attention_forward(a, slot, B);
    }
    const trace::Span span("layer", [&] {
      return "layer " + std::to_string(layout_.global_layer(l)) + (defer ? " input gradients" : " backward");
    });
    block_backward(s, slot, l, d.dresidual, defer);
    if (!defer) report(layout_[layout_.block(l).first].offset);
  }
  if (embeds(chunk)) {
    // A tied embedding's gradient has the head's part and now the embedding's (all rows).
    const Act* dall = gathered_rows(d.dresidual, B);
    k_.embedding_backward(grad(layout_.token_embedding()), dall, s.tokens, host_tokens_.at(slot).data(), vocab_start_,
                          vocab_shard_, B, T, C);
    if (layout_.position_embedding() >= 0)
      k_.positions_backward(grad(layout_.position_embedding()), dall, attention_mask(slot).q_pos, B, T, C);
  }
  if (!defer && chunk == 0) report(0);  // a later chunk's gradients end above chunk 0's
}

void Transformer::attention_forward(const LayerActivations& a, int slot, int B) {
  const int T = T_, hd = spec().head_dim;
  if (ring_) return ring_->forward(a.atty, a.attention_stats, a.qkv, attention_mask(slot), B, activations_.scratch.ring);
  const Act* kv = kernels::offset(a.qkv, static_cast<size_t>(heads_local_) * hd, act_type_);  // a qkv row: q | k v
  k_.attention_forward(a.atty, a.attention_stats, a.qkv, kv, qkv_width_, attention_mask(slot), B, T, T, heads_local_,
                       kv_heads_local_, hd);
}

// dresidual holds d loss / d residual_3 of layer l on entry, and d loss / d (input of
// layer l) on return: the skip connections pass it through, the branches add to it.
// It is the same on every tp rank, so replicated parameters get the same gradients.
void Transformer::block_backward(const Slot& s, int slot, int l, Act* dresidual, bool defer) {
  const TransformerSpec& sp = spec();
  const int B = s.B, T = T_, C = sp.d_model, hd = sp.head_dim, BT = B * T, N = rows(B);
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  const int mlp_in = sp.mlp_in_width(tp_.size());
  const BackwardScratch& d = activations_.scratch;
  // Deferred: each GEMM's output gradient is kept in the slot's buffer of that output (no
  // longer needed once its own backward has run), the norms' gradients in the stash.
  const auto keep = [&](Act* into, const Act* gradient, size_t n) {
    if (defer) k_.copy_on_device(into, gradient, k_.activation_bytes(n));
  };
  const auto weight_grad = [&](int index) { return defer ? nullptr : grad(index); };
  const auto norm_grads = [&](int gain, int bias, int piece) {
    return std::pair<float*, float*>{defer ? stash(a.norm_gradients, piece) : grad(gain),
                                     defer ? (bias >= 0 ? stash(a.norm_gradients, piece + 1) : nullptr) : grad(bias)};
  };
  if (defer) k_.fill_zero(a.norm_gradients, 4 * static_cast<size_t>(C) * sizeof(float));
  const size_t NC = static_cast<size_t>(N) * C;
  // MLP branch (under sequence parallelism each gathered input is used before the next gather).
  keep(a.residual_3, dresidual, NC);
  k_.matmul_backward(d.dfc_act, weight_grad(p.mlp_out_weight), weight_grad(p.mlp_out_bias), gathered_rows(dresidual, B),
                     defer ? nullptr : a.fc_act, weight(p.mlp_out_weight), BT, ffn_local_, C);
  if (sp.mlp == MlpKind::swiglu) k_.swiglu_backward(d.dfc, a.fc, d.dfc_act, BT, ffn_local_);
  else k_.gelu_backward(d.dfc, a.fc, d.dfc_act, static_cast<size_t>(BT) * ffn_local_);
  keep(a.fc, d.dfc, static_cast<size_t>(BT) * mlp_in);
  k_.matmul_backward(d.dnorm, weight_grad(p.mlp_in_weight), weight_grad(p.mlp_in_bias), d.dfc,
                     defer ? nullptr : gathered_rows(a.norm_2, B), weight(p.mlp_in_weight), BT, C, mlp_in);
  const auto [norm_2_gain, norm_2_bias] = norm_grads(p.norm_2_weight, p.norm_2_bias, 2);
  norm_backward(dresidual, p.norm_2_weight, norm_2_gain, norm_2_bias, reduce_gradient_rows(d.dnorm, B), a.residual_2,
                a.norm_2_mean, a.norm_2_rstd, N);
  store_.progress_gathers();
  // Attention branch.
  keep(a.residual_2, dresidual, NC);
  k_.matmul_backward(d.datty, weight_grad(p.attn_out_weight), weight_grad(p.attn_out_bias), gathered_rows(dresidual, B),
                     defer ? nullptr : a.atty, weight(p.attn_out_weight), BT, attention_width_, C);
  const size_t kv_column = static_cast<size_t>(heads_local_) * hd;  // a qkv row: q | k v
  if (ring_)
    ring_->backward(d.dqkv, d.datty, a.qkv, a.atty, a.attention_stats, attention_mask(slot), B, d.ring);
  else
    k_.attention_backward(d.dqkv, kernels::offset(d.dqkv, kv_column, act_type_), d.datty, a.qkv,
                          kernels::offset(a.qkv, kv_column, act_type_), qkv_width_, a.atty, a.attention_stats,
                          attention_mask(slot), B, T, T, heads_local_, kv_heads_local_, hd);
  if (sp.positions == PositionKind::rotary)
    k_.rope_backward(d.dqkv, rope_table_.data(), B, T, heads_local_, kv_heads_local_, hd);
  keep(a.qkv, d.dqkv, static_cast<size_t>(BT) * qkv_width_);
  k_.matmul_backward(d.dnorm, weight_grad(p.qkv_weight), weight_grad(p.qkv_bias), d.dqkv,
                     defer ? nullptr : gathered_rows(a.norm_1, B), weight(p.qkv_weight), BT, C, qkv_width_);
  const auto [norm_1_gain, norm_1_bias] = norm_grads(p.norm_1_weight, p.norm_1_bias, 0);
  norm_backward(dresidual, p.norm_1_weight, norm_1_gain, norm_1_bias, reduce_gradient_rows(d.dnorm, B),
                layer_input(slot, l), a.norm_1_mean, a.norm_1_rstd, N);
}

// The deferred half: dweight += dout^T @ inp of each GEMM, from the output gradients the
// input half kept (re-gathered over tp under sequence parallelism), and the norms' stash.
void Transformer::block_weight_gradients(const Slot& s, int l) {
  const TransformerSpec& sp = spec();
  const int B = s.B, C = sp.d_model, BT = B * T_;
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  k_.add_f32(grad(p.norm_2_weight), stash(a.norm_gradients, 2), C);
  if (p.norm_2_bias >= 0) k_.add_f32(grad(p.norm_2_bias), stash(a.norm_gradients, 3), C);
  k_.matmul_backward(nullptr, grad(p.mlp_out_weight), grad(p.mlp_out_bias), gathered_rows(a.residual_3, B), a.fc_act,
                     nullptr, BT, ffn_local_, C);
  k_.matmul_backward(nullptr, grad(p.mlp_in_weight), grad(p.mlp_in_bias), a.fc, gathered_rows(a.norm_2, B), nullptr,
                     BT, C, sp.mlp_in_width(tp_.size()));
  k_.add_f32(grad(p.norm_1_weight), stash(a.norm_gradients, 0), C);
  if (p.norm_1_bias >= 0) k_.add_f32(grad(p.norm_1_bias), stash(a.norm_gradients, 1), C);
  k_.matmul_backward(nullptr, grad(p.attn_out_weight), grad(p.attn_out_bias), gathered_rows(a.residual_2, B), a.atty,
                     nullptr, BT, attention_width_, C);
  k_.matmul_backward(nullptr, grad(p.qkv_weight), grad(p.qkv_bias), a.qkv, gathered_rows(a.norm_1, B), nullptr, BT, C,
                     qkv_width_);
}

void Transformer::head_weight_gradients(const Slot& s) {
  const int B = s.B, C = spec().d_model, BT = B * T_;
  k_.matmul_backward(nullptr, grad(layout_.head()), nullptr, s.logits, gathered_rows(s.final_norm, B), nullptr, BT, C,
                     vocab_shard_);
  k_.add_f32(grad(layout_.final_norm_weight()), stash(s.final_norm_gradients, 0), C);
  if (layout_.final_norm_bias() >= 0) k_.add_f32(grad(layout_.final_norm_bias()), stash(s.final_norm_gradients, 1), C);
}

// ---- sequence parallelism's regions (model/tensor_parallel.h); identities without ----

const kernels::Act* Transformer::gathered_rows(const Act* mine, int B) {
  if (!tp_.sequence_parallel()) return mine;
  Act* all = activations_.scratch.gathered;
  const size_t block = static_cast<size_t>(rows(B)) * spec().d_model;
  k_.copy_on_device(kernels::offset(all, tp_.rank() * block, act_type_), mine, k_.activation_bytes(block));
  tp_.gather_sequence(hidden(all, B));
  return all;
}

kernels::Act* Transformer::row_parallel_output(Act* mine) const {
  return tp_.sequence_parallel() ? activations_.scratch.gathered : mine;
}

void Transformer::reduce_rows(Act* partial, Act* mine, int B) {
  if (tp_.sequence_parallel()) tp_.scatter_sequence(hidden(partial, B), rows_of(mine, B));
  else tp_.reduce_from_region(hidden(mine, B));
}

const kernels::Act* Transformer::reduce_gradient_rows(Act* partial, int B) {
  if (!tp_.sequence_parallel()) {
    tp_.reduce_gradient_into_region(hidden(partial, B));
    return partial;
  }
  tp_.scatter_sequence(hidden(partial, B), rows_of(activations_.scratch.dnorm_rows, B));
  return activations_.scratch.dnorm_rows;
}

}  // namespace trident
