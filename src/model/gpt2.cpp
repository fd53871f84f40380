#include "model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/error.h"
#include "runtime/random.h"

namespace trident {

DeviceBuffer::DeviceBuffer(kernels::Kernels& k, size_t floats)
    : k_(&k), data_(static_cast<float*>(k.alloc(floats * sizeof(float)))), size_(floats) {}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : k_(other.k_), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(k_, other.k_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) k_->free(data_);
}

GPT2::GPT2(const ModelConfig& config, int micro_batch, kernels::Kernels& k, TensorParallel tp, size_t buffer_multiple,
           const StageSpec& stage, int slots)
    : config_(config), stage_(stage), tp_(tp), layout_(config, tp.rank(), tp.size(), buffer_multiple, stage),
      B_(micro_batch), k_(k), params_(k, layout_.total_floats()), grads_(k, layout_.total_floats()),
      act_type_(k.activation_type()) {
  check(micro_batch > 0 && slots > 0, "micro_batch and slots must be positive");
  C_local_ = config.d_model / tp.size();
  heads_local_ = config.n_head / tp.size();
  vocab_shard_ = config.padded_vocab(tp.size()) / tp.size();
  vocab_start_ = tp.rank() * vocab_shard_;
  vocab_valid_ = std::clamp(config.vocab_size - vocab_start_, 0, vocab_shard_);
  if (k.precision() == kernels::Precision::fp32) {
    weights_act_ = kernels::as_act(params_.data());  // fp32 compute reads the parameters themselves
  } else {
    weights_ = DeviceBuffer(k, (k.activation_bytes(layout_.total_floats()) + 3) / 4);
    weights_act_ = reinterpret_cast<Act*>(weights_.data());
  }
  allocate_activations(slots);
}

void GPT2::refresh_weights() {
  if (weights_stale_ && weights_.data() != nullptr)
    k_.cast_to_activation(weights_act_, params_.data(), layout_.total_floats());
  weights_stale_ = false;
}

void GPT2::allocate_activations(int slots) {
  const size_t B = B_, T = config_.seq_len, C = config_.d_model, Cl = C_local_, NHl = heads_local_;
  const size_t BT = B * T, Vs = vocab_shard_;
  // First pass counts bytes, second pass hands out pointers: one allocation, so every
  // page is touched once at start. Activations take the backend's type, statistics fp32.
  std::vector<std::pair<void**, size_t>> plan;
  const auto want_bytes = [&plan](void** p, size_t bytes) { plan.emplace_back(p, (bytes + 63) / 64 * 64); };
  const auto want = [&](Act*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), k_.activation_bytes(n)); };
  const auto want_f32 = [&](float*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), n * sizeof(float)); };
  const auto want_i32 = [&](int32_t*& p, size_t n) { want_bytes(reinterpret_cast<void**>(&p), n * sizeof(int32_t)); };
  slots_.resize(slots);
  for (Slot& s : slots_) {
    want_i32(s.tokens, BT);
    want_i32(s.targets, BT);
    want(s.encoded, BT * C);
    s.layers.resize(layout_.layers());
    for (auto& a : s.layers) {
      want(a.ln_1, BT * C);
      want_f32(a.ln_1_mean, BT);
      want_f32(a.ln_1_rstd, BT);
      want(a.qkv, BT * 3 * Cl);
      want(a.atty, BT * Cl);
      want_f32(a.attention_stats, k_.attention_stats_floats(B, T, NHl));
      want(a.residual_2, BT * C);
      want(a.ln_2, BT * C);
      want_f32(a.ln_2_mean, BT);
      want_f32(a.ln_2_rstd, BT);
      want(a.fc, BT * 4 * Cl);
      want(a.fc_gelu, BT * 4 * Cl);
      want(a.residual_3, BT * C);
    }
    if (stage_.has_head) {
      want(s.ln_f, BT * C);
      want_f32(s.ln_f_mean, BT);
      want_f32(s.ln_f_rstd, BT);
      want(s.logits, BT * Vs);
      want_f32(s.losses, BT);
      want_f32(s.row_max, BT);
      want_f32(s.sum_and_target, 2 * BT);
      want_f32(s.lse, BT);
    }
  }
  want(dresidual_, BT * C);
  want(dln_, BT * C);
  want(datty_, BT * Cl);
  want(dqkv_, BT * 3 * Cl);
  want(dfc_, BT * 4 * Cl);
  activation_bytes_ = 0;
  for (auto& [ptr, bytes] : plan) activation_bytes_ += bytes;
  activations_ = DeviceBuffer(k_, activation_bytes_ / sizeof(float));
  char* next = reinterpret_cast<char*>(activations_.data());
  for (auto& [ptr, bytes] : plan) {
    *ptr = next;
    next += bytes;
  }
  host_losses_.resize(BT);
}

void GPT2::init_parameters(uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * config_.n_layer);
  std::vector<float> full;
  for (const auto& t : layout_.tensors()) {  // of this stage
    // The full tensor on every rank, then this rank's shard: the same values under any tp.
    full.assign(t.numel(), 0.0f);
    const bool is_layernorm = t.name.find("ln_") != std::string::npos;
    const bool is_bias = t.name.ends_with(".bias");
    if (is_layernorm && !is_bias) {
      std::fill(full.begin(), full.end(), 1.0f);
    } else if (!is_bias) {
      const bool residual_projection = t.name.ends_with("c_proj.weight");
      const double std = 0.02 * (residual_projection ? residual_scale : 1.0);
      const uint64_t stream = hash_name(t.name);
      for (size_t i = 0; i < full.size(); i++) full[i] = static_cast<float>(std * normal_at(seed, stream, i));
    }
    set_parameter(t.name, full.data(), full.size());
  }
}

void GPT2::set_parameter(const std::string& name, const float* host, size_t count) {
  const ParameterTensor& t = layout_.tensor(name);
  require(count == t.numel(), "parameter " + name + " has " + std::to_string(t.numel()) +
                                  " elements, got " + std::to_string(count));
  const std::vector<float> shard = layout_.shard_of(t, host);
  k_.copy_to_device(params_.data() + t.offset, shard.data(), shard.size() * sizeof(float));
  parameters_changed();
}

std::vector<float> GPT2::get_parameter(const std::string& name, bool gradient) {
  const ParameterTensor& t = layout_.tensor(name);
  const int shards = t.sharded() ? tp_.size() : 1;
  std::vector<float> all(t.stored * shards);
  const float* base = gradient ? grads_.data() : params_.data();
  const int mine = t.sharded() ? tp_.rank() : 0;
  k_.copy_to_host(all.data() + mine * t.stored, base + t.offset, t.stored * sizeof(float));
  if (shards > 1) tp_.communicator()->all_gather(all);
  return layout_.assemble(t, all);
}

void GPT2::zero_grad() { k_.fill_zero(grads_.data(), grads_.size() * sizeof(float)); }

kernels::Act* GPT2::layer_input(int slot, int l) const {
  return l == 0 ? slots_[slot].encoded : slots_[slot].layers[l - 1].residual_3;
}

float GPT2::forward(int slot, const int32_t* tokens, const int32_t* targets, int B) {
  check(B > 0 && B <= B_, "forward: batch " + std::to_string(B) + " exceeds the micro-batch " +
                              std::to_string(B_));
  Slot& s = slots_.at(slot);
  const int T = config_.seq_len, C = config_.d_model, V = config_.vocab_size, BT = B * T;
  for (int i = 0; i < BT; i++)
    require(tokens[i] >= 0 && tokens[i] < V && targets[i] >= 0 && targets[i] < V,
            "token id out of range [0, " + std::to_string(V) + ") at position " + std::to_string(i));
  k_.copy_to_device(s.tokens, tokens, BT * sizeof(int32_t));
  k_.copy_to_device(s.targets, targets, BT * sizeof(int32_t));
  s.B = B;
  refresh_weights();

  if (stage_.has_embedding) {
    // Vocabulary-parallel embedding: each token's row comes from the shard that owns it.
    k_.embedding_forward(s.encoded, s.tokens, weight(layout_.wte()), vocab_start_, vocab_shard_, B, T, C);
    tp_.sum_embedding_shards(hidden(s.encoded, B));
    k_.add_positions(s.encoded, weight(layout_.wpe()), B, T, C);
  }
  for (int l = 0; l < layout_.layers(); l++) block_forward(s, slot, l);
  if (!stage_.has_head) return 0.0f;
  k_.layernorm_forward(s.ln_f, s.ln_f_mean, s.ln_f_rstd, layer_input(slot, layout_.layers()),
                       weight(layout_.ln_f_weight()), weight(layout_.ln_f_bias()), BT, C,
                       static_cast<float>(config_.layernorm_eps));
  // Tied, vocabulary-parallel head: this rank's logits are ln_f(x) @ wte_shard^T; the
  // softmax over the whole vocabulary is assembled from per-shard partials.
  k_.matmul_forward(s.logits, s.ln_f, weight(layout_.wte()), nullptr, BT, C, vocab_shard_);
  k_.logits_row_max(s.row_max, s.logits, BT, vocab_valid_, vocab_shard_);
  tp_.max_over_vocab_shards(s.row_max, BT);
  k_.logits_sum_exp_and_target(s.sum_and_target, s.logits, s.row_max, s.targets, vocab_start_, BT, vocab_valid_,
                               vocab_shard_);
  tp_.sum_over_vocab_shards(s.sum_and_target, 2 * static_cast<size_t>(BT));
  k_.cross_entropy_loss(s.losses, s.lse, s.row_max, s.sum_and_target, BT);
  k_.copy_to_host(host_losses_.data(), s.losses, BT * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += host_losses_[i];
  return static_cast<float>(sum / BT);
}

void GPT2::block_forward(const Slot& s, int slot, int l) {
  const int B = s.B, T = config_.seq_len, C = config_.d_model, Cl = C_local_, BT = B * T;
  const float eps = static_cast<float>(config_.layernorm_eps);
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  const Act* residual = layer_input(slot, l);
  const size_t BTC = static_cast<size_t>(BT) * C;
  // The row-parallel biases are added by one rank, before the sum over tp.
  const bool add_replicated_bias = tp_.rank() == 0;
  // Attention: residual_2 = residual + c_proj(attention(c_attn(ln_1(residual))))
  k_.layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, residual, weight(p.ln_1_weight),
                       weight(p.ln_1_bias), BT, C, eps);
  k_.matmul_forward(a.qkv, a.ln_1, weight(p.c_attn_weight), weight(p.c_attn_bias), BT, C, 3 * Cl);  // column-parallel
  k_.attention_forward(a.atty, a.attention_stats, a.qkv, B, T, Cl, heads_local_);
  k_.matmul_forward(a.residual_2, a.atty, weight(p.attn_c_proj_weight),  // row-parallel
                    add_replicated_bias ? weight(p.attn_c_proj_bias) : nullptr, BT, Cl, C);
  tp_.reduce_from_region(span(a.residual_2, BTC));
  k_.add(a.residual_2, a.residual_2, residual, BTC);
  // MLP: residual_3 = residual_2 + c_proj(gelu(c_fc(ln_2(residual_2))))
  k_.layernorm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_2, weight(p.ln_2_weight),
                       weight(p.ln_2_bias), BT, C, eps);
  k_.matmul_forward(a.fc, a.ln_2, weight(p.c_fc_weight), weight(p.c_fc_bias), BT, C, 4 * Cl);  // column-parallel
  k_.gelu_forward(a.fc_gelu, a.fc, static_cast<size_t>(BT) * 4 * Cl);
  k_.matmul_forward(a.residual_3, a.fc_gelu, weight(p.mlp_c_proj_weight),  // row-parallel
                    add_replicated_bias ? weight(p.mlp_c_proj_bias) : nullptr, BT, 4 * Cl, C);
  tp_.reduce_from_region(span(a.residual_3, BTC));
  k_.add(a.residual_3, a.residual_3, a.residual_2, BTC);
}

void GPT2::backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from) {
  const Slot& s = slots_.at(slot);
  check(s.B > 0, "backward() without forward()");
  const auto report = [&](size_t offset) {
    if (grads_final_from) grads_final_from(offset);
  };
  const int B = s.B, T = config_.seq_len, C = config_.d_model, BT = B * T;
  if (stage_.has_head) {
    // Head: logits become dlogits in place, then through the tied wte and ln_f.
    k_.cross_entropy_backward(s.logits, s.lse, s.targets, vocab_start_, BT, vocab_valid_, vocab_shard_, loss_scale);
    k_.matmul_backward(dln_, grad(layout_.wte()), nullptr, s.logits, s.ln_f, weight(layout_.wte()), BT, C,
                       vocab_shard_);
    tp_.reduce_gradient_into_region(hidden(dln_, B));
    k_.fill_zero(dresidual_, hidden(dresidual_, B).bytes());
    k_.layernorm_backward(dresidual_, grad(layout_.ln_f_weight()), grad(layout_.ln_f_bias()), dln_,
                          layer_input(slot, layout_.layers()), weight(layout_.ln_f_weight()), s.ln_f_mean,
                          s.ln_f_rstd, BT, C);
    report(layout_[layout_.ln_f_weight()].offset);
  }  // else the pipeline put d loss / d output into dresidual_
  for (int l = layout_.layers() - 1; l >= 0; l--) {
    block_backward(s, slot, l, dresidual_);
    report(layout_[layout_.block(l).ln_1_weight].offset);
  }
  if (stage_.has_embedding) {
    // wte is tied: its gradient has the head's part and now the embedding's.
    k_.embedding_backward(grad(layout_.wte()), dresidual_, s.tokens, vocab_start_, vocab_shard_, B, T, C);
    k_.positions_backward(grad(layout_.wpe()), dresidual_, B, T, C);
  }
  report(0);
}

// dresidual holds d loss / d residual_3 of layer l on entry, and d loss / d (input of
// layer l) on return: the skip connections pass it through, the branches add to it.
// It is the same on every tp rank, so replicated parameters get the same gradients.
void GPT2::block_backward(const Slot& s, int slot, int l, Act* dresidual) {
  const int B = s.B, T = config_.seq_len, C = config_.d_model, Cl = C_local_, BT = B * T;
  const BlockParameterIndex& p = layout_.block(l);
  const LayerActivations& a = s.layers[l];
  Act* dfc = dfc_;
  // MLP branch.
  k_.matmul_backward(dfc, grad(p.mlp_c_proj_weight), grad(p.mlp_c_proj_bias), dresidual, a.fc_gelu,
                     weight(p.mlp_c_proj_weight), BT, 4 * Cl, C);
  k_.gelu_backward(dfc, a.fc, dfc, static_cast<size_t>(BT) * 4 * Cl);
  k_.matmul_backward(dln_, grad(p.c_fc_weight), grad(p.c_fc_bias), dfc, a.ln_2, weight(p.c_fc_weight), BT, C, 4 * Cl);
  tp_.reduce_gradient_into_region(hidden(dln_, B));
  k_.layernorm_backward(dresidual, grad(p.ln_2_weight), grad(p.ln_2_bias), dln_, a.residual_2,
                        weight(p.ln_2_weight), a.ln_2_mean, a.ln_2_rstd, BT, C);
  // Attention branch.
  k_.matmul_backward(datty_, grad(p.attn_c_proj_weight), grad(p.attn_c_proj_bias), dresidual, a.atty,
                     weight(p.attn_c_proj_weight), BT, Cl, C);
  k_.attention_backward(dqkv_, datty_, a.qkv, a.atty, a.attention_stats, B, T, Cl, heads_local_);
  k_.matmul_backward(dln_, grad(p.c_attn_weight), grad(p.c_attn_bias), dqkv_, a.ln_1, weight(p.c_attn_weight), BT,
                     C, 3 * Cl);
  tp_.reduce_gradient_into_region(hidden(dln_, B));
  k_.layernorm_backward(dresidual, grad(p.ln_1_weight), grad(p.ln_1_bias), dln_, layer_input(slot, l),
                        weight(p.ln_1_weight), a.ln_1_mean, a.ln_1_rstd, BT, C);
}

}  // namespace trident
