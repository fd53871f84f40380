#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "monitor/step_trace.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace trident {

ActivationShape activation_shape(const ParameterLayout& layout, int micro_batch, int slots, Recompute recompute,
                                 const kernels::Footprint& k, int sequence_shards) {
  const TransformerSpec& s = layout.spec();
  const int tp = layout.tp_size();
  const int heads = s.n_head / tp, kv_heads = s.n_kv_head / s.kv_shards(tp);
  ActivationShape a;
  a.micro_batch = micro_batch;
  a.seq_len = s.seq_len;
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
  a.attention_stats_floats = k.attention_stats_floats(micro_batch, s.seq_len, heads);
  a.sequence_shards = sequence_shards;
  return a;
}

namespace {

// Where each unit's gradients live in the gradient storage. Without windows: where
// the unit is in the flat layout. With windows: the kept units first (all but the
// blocks), then window 0 and window 1, each as large as the largest block; block l in
// window l % 2.
struct GradientStorage {
  size_t floats = 0;
  std::vector<size_t> unit_start;
};

GradientStorage gradient_storage(const ParameterLayout& layout, bool windowed) {
  const std::vector<FlatRange>& units = layout.units();
  GradientStorage g;
  if (!windowed) {
    for (const FlatRange& u : units) g.unit_start.push_back(u.begin);
    g.floats = layout.total_floats();
    return g;
  }
  const std::vector<bool>& block = layout.unit_is_block();
  size_t window = 0;
  for (int l = 0; l < layout.layers(); l++) window = std::max(window, units[layout.block_unit(l)].size());
  g.unit_start.resize(units.size());
  for (size_t u = 0; u < units.size(); u++)
    if (!block[u]) g.unit_start[u] = g.floats, g.floats += units[u].size();
  for (int l = 0; l < layout.layers(); l++) g.unit_start[layout.block_unit(l)] = g.floats + (l % 2) * window;
  g.floats += std::min(layout.layers(), 2) * window;
  return g;
}

}  // namespace

size_t Transformer::gradient_floats_for(const ParameterLayout& layout, bool windowed) {
  return gradient_storage(layout, windowed).floats;
}

float* Transformer::gradient_location(size_t offset) const {
  const size_t u = layout_.unit_of(offset);
  return grads_.data() + unit_storage_[u] + (offset - layout_.units()[u].begin);
}

Transformer::Transformer(const ModelConfig& config, int micro_batch, kernels::Kernels& k, TensorParallel tp,
                         size_t buffer_multiple, const StageSpec& stage, int slots, Recompute recompute,
                         bool windowed_gradients, Communicator* parameter_shards)
    : stage_(stage), tp_(tp), layout_(transformer_spec(config), tp.rank(), tp.size(), buffer_multiple, stage),
      B_(micro_batch), k_(k), windowed_(windowed_gradients),
      shards_(parameter_shards != nullptr && parameter_shards->size() > 1 ? parameter_shards : nullptr),
      params_(k, parameter_floats_for(layout_, shards_ != nullptr, k.precision())),
      grads_(k, gradient_floats_for(layout_, windowed_gradients)), act_type_(k.activation_type()),
      activations_(activation_shape(layout_, micro_batch, slots, recompute, k, tp.sequence_parallel() ? tp.size() : 1),
                   k) {
  check(shards_ == nullptr || windowed_, "sharded parameters (ZeRO-3) need windowed gradients");
  unit_storage_ = gradient_storage(layout_, windowed_).unit_start;
  for (const ParameterTensor& t : layout_.tensors())
    grad_offset_.push_back(static_cast<size_t>(gradient_location(t.offset) - grads_.data()));
  // Parameters: stored as the gradients are (ZeRO-3: the kept units and the two windows).
  for (const ParameterTensor& t : layout_.tensors()) param_offset_.push_back(t.offset);
  if (shards_ != nullptr) {
    const std::vector<FlatRange>& units = layout_.units();
    const size_t ranks = shards_->size(), rank = shards_->rank();
    size_t floats = 0;
    for (const FlatRange& u : units) {
      check(u.size() % ranks == 0, "ZeRO-3: a unit must be a multiple of the shard group");
      const size_t piece = u.size() / ranks;
      held_.push_back({u.begin + rank * piece, u.begin + (rank + 1) * piece});
      master_offset_.push_back(floats);
      floats += piece;
    }
    master_ = kernels::DeviceBuffer(k, floats);
    for (size_t i = 0; i < param_offset_.size(); i++)
      param_offset_[i] = static_cast<size_t>(gradient_location(layout_[i].offset) - grads_.data());
  }
  const size_t compute_floats = gradient_floats_for(layout_, shards_ != nullptr);  // what the layers read
  const TransformerSpec& s = spec();
  heads_local_ = s.n_head / tp.size();
  kv_heads_local_ = s.n_kv_head / s.kv_shards(tp.size());
  qkv_width_ = (heads_local_ + 2 * kv_heads_local_) * s.head_dim;
  attention_width_ = heads_local_ * s.head_dim;
  ffn_local_ = s.mlp_activation_width(tp.size());
  vocab_shard_ = s.padded_vocab(tp.size()) / tp.size();
  vocab_start_ = tp.rank() * vocab_shard_;
  vocab_valid_ = std::clamp(s.vocab_size - vocab_start_, 0, vocab_shard_);
  if (k.precision() == kernels::Precision::fp32) {
    weights_act_ = kernels::as_act(params_.data());  // fp32 compute reads the parameters themselves
  } else {
    weights_ = kernels::DeviceBuffer(k, (k.activation_bytes(compute_floats) + 3) / 4);
    weights_act_ = reinterpret_cast<Act*>(weights_.data());
  }
  if (s.positions == PositionKind::rotary) {
    const std::vector<float> table = rope_table(s);
    rope_table_ = kernels::DeviceBuffer(k, table.size());
    k.copy_to_device(rope_table_.data(), table.data(), table.size() * sizeof(float));
  }
  loss_sum_ = kernels::DeviceBuffer(k, 2);  // one double
  host_tokens_.resize(slots);
  // The kernels' workspace for these shapes now, as the memory plan counts it.
  k.reserve_workspace(micro_batch * s.seq_len, s.d_model, activations_.shape().widest_output(), micro_batch,
                      s.seq_len, heads_local_);
}

void Transformer::refresh_weights() {
  if (!weights_stale_) return;
  weights_stale_ = false;
  if (shards_ == nullptr) {
    if (weights_.data() != nullptr) k_.cast_to_activation(weights_act_, params_.data(), layout_.total_floats());
    return;
  }
  // ZeRO-3: the kept units (embeddings, final norm and head) gathered whole; the blocks
  // as they come.
  const std::vector<bool>& block = layout_.unit_is_block();
  std::vector<RequestPtr> gathers;  // all started, then waited for
  for (size_t u = 0; u < block.size(); u++)
    if (!block[u]) gathers.push_back(gather_unit(u));
  for (RequestPtr& g : gathers) g->wait();
}

void Transformer::progress_gathers() {
  // MPI moves a non-blocking operation on only inside MPI calls: without these the next
  // block's gather would wait for the next wait.
  for (RequestPtr& g : window_gather_)
    if (g) g->test();
}

size_t Transformer::parameter_floats_for(const ParameterLayout& layout, bool sharded, kernels::Precision precision) {
  // ZeRO-3 in bf16 gathers the compute copy itself: the fp32 values live in the shard only.
  if (sharded && precision != kernels::Precision::fp32) return 0;
  return gradient_floats_for(layout, sharded);
}

void Transformer::parameters_changed() {
  weights_stale_ = true;
  for (int w = 0; w < 2; w++) {
    window_gather_[w].reset();  // waits for a gather still in flight
    window_block_[w] = -1;
  }
}

float* Transformer::parameter_at(size_t offset) const {
  if (shards_ == nullptr) return params_.data() + offset;
  const size_t i = layout_.unit_of(offset);
  check(offset >= held_[i].begin && offset < held_[i].end, "parameter_at: not an offset this rank holds");
  return master_.data() + master_offset_[i] + (offset - held_[i].begin);
}

RequestPtr Transformer::gather_unit(size_t u) {
  const FlatRange& unit = layout_.units()[u];
  const size_t piece = held_[u].size(), mine = shards_->rank() * piece;
  const float* master = master_.data() + master_offset_[u];
  // In place: this rank's piece at its position, the others' arrive around it. In bf16
  // the compute copy is what travels (half the bytes, as FSDP's bf16 param_dtype).
  if (weights_.data() == nullptr) {  // fp32: the layers read the parameters themselves
    float* storage = params_.data() + unit_storage_[u];
    k_.copy_on_device(storage + mine, master, piece * sizeof(float));
    return shards_->all_gather_async(std::span<float>(storage, unit.size()));
  }
  Act* storage = kernels::offset(weights_act_, unit_storage_[u], act_type_);
  k_.cast_to_activation(kernels::offset(storage, mine, act_type_), master, piece);
  return shards_->all_gather_async(ActivationSpan{storage, unit.size(), act_type_});
}

void Transformer::gather_block(int l) {
  const int w = l % 2;
  if (window_block_[w] == l) return;  // there, or on its way
  window_gather_[w].reset();
  window_gather_[w] = gather_unit(static_cast<size_t>(layout_.block_unit(l)));
  window_block_[w] = l;
}

void Transformer::use_block(int l, int next) {
  const int w = l % 2;
  gather_block(l);
  if (window_gather_[w]) window_gather_[w]->wait();
  window_gather_[w].reset();
  // Ahead: the other window's block is done with (forward: the one before; backward: after).
  if (next >= 0 && next < layout_.layers()) gather_block(next);
}

void Transformer::init_parameters(uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * spec().n_layer);
  const ShardedParameters view = parameters();
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
  parameters_changed();
}

void Transformer::set_parameter(const std::string& name, const float* host, size_t count) {
  const ParameterTensor& t = layout_.tensor(name);
  require(count == t.numel(), "parameter " + name + " has " + std::to_string(t.numel()) +
                                  " elements, got " + std::to_string(count));
  parameters().set(t, host);
  parameters_changed();
}

std::vector<float> Transformer::get_parameter(const std::string& name, bool gradient) {
  const int index = static_cast<int>(&layout_.tensor(name) - layout_.tensors().data());
  const ParameterTensor& t = layout_[index];
  std::vector<float> mine(t.stored);
  if (gradient) {
    k_.copy_to_host(mine.data(), grad(index), t.stored * sizeof(float));
  } else {
    parameters().shard_to_host(t, mine.data());
    // ZeRO-3: this rank's part of it, the others' parts from them (zeros here).
    if (shards_ != nullptr) shards_->all_reduce(std::span<float>(mine));
  }
  return assemble_over_tp(t, mine);
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

void Transformer::zero_grad() { k_.fill_zero(grads_.data(), grads_.size() * sizeof(float)); }

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

void Transformer::norm_backward(Act* dinp, int weight_index, int bias_index, const Act* dout, const Act* inp,
                                const float* mean, const float* rstd, int N) {
  const int C = spec().d_model;
  if (spec().norm == NormKind::layernorm)
    k_.layernorm_backward(dinp, grad(weight_index), grad_or_null(bias_index), dout, inp, weight(weight_index), mean, rstd, N,
                          C);
  else
    k_.rmsnorm_backward(dinp, grad(weight_index), dout, inp, weight(weight_index), rstd, N, C);
}

void Transformer::forward(int slot, const int32_t* tokens, const int32_t* targets, int B) {
  check(B > 0 && B <= B_, "forward: batch " + std::to_string(B) + " exceeds the micro-batch " +
                              std::to_string(B_));
  Slot& s = activations_.slots.at(slot);
  const int T = spec().seq_len, C = spec().d_model, V = spec().vocab_size, BT = B * T;
  for (int i = 0; i < BT; i++)  // the message is built only on failure (this runs for every token)
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw UsageError("token id out of range [0, " + std::to_string(V) + ") at position " + std::to_string(i));
  // Without waiting for the device: the first stage embeds the tokens (and keeps the
  // host's copy for the embedding's backward), the last scores the targets.
  if (stage_.has_embedding) {
    k_.upload(s.tokens, tokens, BT * sizeof(int32_t));
    host_tokens_.at(slot).assign(tokens, tokens + BT);
  }
  if (stage_.has_head) k_.upload(s.targets, targets, BT * sizeof(int32_t));
  s.B = B;
  refresh_weights();

  if (stage_.has_embedding) {
    // Vocabulary-parallel embedding: each token's row comes from the shard that owns it.
    const int wpe = layout_.position_embedding();
    if (tp_.sequence_parallel()) {
      // The partial sums of all rows, positions added once (rank 0), each rank's rows summed.
      Act* partial = activations_.scratch.gathered;
      k_.embedding_forward(partial, s.tokens, weight(layout_.token_embedding()), vocab_start_, vocab_shard_, B, T, C);
      if (wpe >= 0 && tp_.rank() == 0) k_.add_positions(partial, weight(wpe), B, T, C);
      tp_.scatter_sequence(hidden(partial, B), rows_of(s.encoded, B));
    } else {
      k_.embedding_forward(s.encoded, s.tokens, weight(layout_.token_embedding()), vocab_start_, vocab_shard_, B, T,
                           C);
      tp_.sum_embedding_shards(hidden(s.encoded, B));
      if (wpe >= 0) k_.add_positions(s.encoded, weight(wpe), B, T, C);
    }
  }
  for (int l = 0; l < layout_.layers(); l++) {
    if (shards_ != nullptr) use_block(l, l + 1);
    const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.first_layer() + l) + " forward"; });
    block_forward(s, slot, l);
  }
  if (!stage_.has_head) return;
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
  return static_cast<float>(take_loss_sum() / (static_cast<double>(B) * spec().seq_len));
}

std::vector<float> Transformer::logits(int slot, int b, int t) {
  const Slot& s = activations_.slots.at(slot);
  check(stage_.has_head && b < s.B && t < spec().seq_len, "logits: no such row on this stage");
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
  const int B = s.B, T = sp.seq_len, C = sp.d_model, hd = sp.head_dim, BT = B * T, N = rows(B);
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
  k_.attention_forward(a.atty, a.attention_stats, a.qkv, B, T, heads_local_, kv_heads_local_, hd);
  if (shards_ != nullptr) progress_gathers();
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
  if (shards_ != nullptr) progress_gathers();
  if (up_to_mlp) return;
  out = row_parallel_output(a.residual_3);
  k_.matmul_forward(out, a.fc_act, weight(p.mlp_out_weight),  // row-parallel
                    add_replicated_bias ? weight(p.mlp_out_bias) : nullptr, BT, ffn_local_, C);
  reduce_rows(out, a.residual_3, B);
  k_.add(a.residual_3, a.residual_3, a.residual_2, NC);
}

void Transformer::backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from,
                           const std::function<void(int)>& block_begins) {
  const Slot& s = activations_.slots.at(slot);
  check(s.B > 0, "backward() without forward()");
  const BackwardScratch& d = activations_.scratch;
  const auto report = [&](size_t offset) {
    if (grads_final_from) grads_final_from(offset);
  };
  const int B = s.B, T = spec().seq_len, C = spec().d_model, BT = B * T;
  if (stage_.has_head) {
    // Head: logits become dlogits in place, then through the head and the final norm.
    k_.cross_entropy_backward(s.logits, s.lse, s.targets, vocab_start_, BT, vocab_valid_, vocab_shard_, loss_scale);
    k_.matmul_backward(d.dnorm, grad(layout_.head()), nullptr, s.logits, gathered_rows(s.final_norm, B),
                       weight(layout_.head()), BT, C, vocab_shard_);
    const Act* dnorm = reduce_gradient_rows(d.dnorm, B);
    k_.fill_zero(d.dresidual, rows_of(d.dresidual, B).bytes());
    norm_backward(d.dresidual, layout_.final_norm_weight(), layout_.final_norm_bias(), dnorm,
                  layer_input(slot, layout_.layers()), s.final_norm_mean, s.final_norm_rstd, rows(B));
    report(layout_[layout_.final_norm_weight()].offset);
  }  // else the pipeline put d loss / d output into d.dresidual
  for (int l = layout_.layers() - 1; l >= 0; l--) {
    if (block_begins) block_begins(l);
    if (shards_ != nullptr) use_block(l, l - 1);
    // What the layer did not keep, recomputed into the shared set (model/activations.h).
    if (recompute() == Recompute::full) {
      const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.first_layer() + l) + " recompute"; });
      block_forward(s, slot, l, /*up_to_mlp=*/true);
    } else if (recompute() == Recompute::selective) {
      const LayerActivations& a = s.layers[l];
      k_.attention_forward(a.atty, a.attention_stats, a.qkv, B, T, heads_local_, kv_heads_local_, spec().head_dim);
    }
    const trace::Span span("layer", [&] { return "layer " + std::to_string(layout_.first_layer() + l) + " backward"; });
    block_backward(s, slot, l, d.dresidual);
    report(layout_[layout_.block(l).first].offset);
  }
  if (stage_.has_embedding) {
    // A tied embedding's gradient has the head's part and now the embedding's (all rows).
    const Act* dall = gathered_rows(d.dresidual, B);
    k_.embedding_backward(grad(layout_.token_embedding()), dall, s.tokens, host_tokens_.at(slot).data(), vocab_start_,
                          vocab_shard_, B, T, C);
    if (layout_.position_embedding() >= 0) k_.positions_backward(grad(layout_.position_embedding()), dall, B, T, C);
  }
  report(0);
}

// dresidual holds d loss / d residual_3 of layer l on entry, and d loss / d (input of
// layer l) on return: the skip connections pass it through, the branches add to it.
// It is the same on every tp rank, so replicated parameters get the same gradients.
void Transformer::block_backward(const Slot& s, int slot, int l, Act* dresidual) {
  const TransformerSpec& sp = spec();
  const int B = s.B, T = sp.seq_len, C = sp.d_model, hd = sp.head_dim, BT = B * T, N = rows(B);
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  const int mlp_in = sp.mlp_in_width(tp_.size());
  const BackwardScratch& d = activations_.scratch;
  // MLP branch (under sequence parallelism each gathered input is used before the next gather).
  k_.matmul_backward(d.dfc_act, grad(p.mlp_out_weight), grad_or_null(p.mlp_out_bias), gathered_rows(dresidual, B),
                     a.fc_act, weight(p.mlp_out_weight), BT, ffn_local_, C);
  if (sp.mlp == MlpKind::swiglu) k_.swiglu_backward(d.dfc, a.fc, d.dfc_act, BT, ffn_local_);
  else k_.gelu_backward(d.dfc, a.fc, d.dfc_act, static_cast<size_t>(BT) * ffn_local_);
  k_.matmul_backward(d.dnorm, grad(p.mlp_in_weight), grad_or_null(p.mlp_in_bias), d.dfc, gathered_rows(a.norm_2, B),
                     weight(p.mlp_in_weight), BT, C, mlp_in);
  norm_backward(dresidual, p.norm_2_weight, p.norm_2_bias, reduce_gradient_rows(d.dnorm, B), a.residual_2,
                a.norm_2_mean, a.norm_2_rstd, N);
  if (shards_ != nullptr) progress_gathers();
  // Attention branch.
  k_.matmul_backward(d.datty, grad(p.attn_out_weight), grad_or_null(p.attn_out_bias), gathered_rows(dresidual, B),
                     a.atty, weight(p.attn_out_weight), BT, attention_width_, C);
  k_.attention_backward(d.dqkv, d.datty, a.qkv, a.atty, a.attention_stats, B, T, heads_local_, kv_heads_local_, hd);
  if (sp.positions == PositionKind::rotary)
    k_.rope_backward(d.dqkv, rope_table_.data(), B, T, heads_local_, kv_heads_local_, hd);
  k_.matmul_backward(d.dnorm, grad(p.qkv_weight), grad_or_null(p.qkv_bias), d.dqkv, gathered_rows(a.norm_1, B),
                     weight(p.qkv_weight), BT, C, qkv_width_);
  norm_backward(dresidual, p.norm_1_weight, p.norm_1_bias, reduce_gradient_rows(d.dnorm, B), layer_input(slot, l),
                a.norm_1_mean, a.norm_1_rstd, N);
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
