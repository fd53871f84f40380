// GPT-2 with explicit forward and backward passes, layer by layer, over the kernel API
// (kernels/kernels.h), so the same model runs on any backend. It owns its parameters,
// gradients and one micro-batch of activations, all allocated once at construction.
// Mixed precision: parameters and gradients are fp32; the layers read a compute copy
// of the weights in the activation type (bf16 or fp32; with fp32 the copy is the
// parameters themselves), refreshed whenever the parameters change.
// Under tensor parallelism each rank holds its shard (model/parameters.h): heads and MLP
// columns split Megatron-style, the vocabulary split for the embedding and the loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/config.h"
#include "parallel/communicator.h"
#include "kernels/kernels.h"
#include "model/parameters.h"
#include "model/tensor_parallel.h"

namespace trident {

// A buffer of the backend's memory, freed with it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(kernels::Kernels& k, size_t floats);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  float* data() const { return data_; }
  size_t size() const { return size_; }
  int32_t* as_int32() const { return reinterpret_cast<int32_t*>(data_); }

 private:
  kernels::Kernels* k_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

class GPT2 {
 public:
  // micro_batch: sequences per forward/backward (the activation buffers' size).
  // tp: the tensor-parallel group (default: one rank). buffer_multiple: the flat
  // parameter and gradient buffers are padded to a multiple. stage: the part of the
  // model held here (pipeline parallelism; default all). slots: micro-batches whose
  // activations can be alive at once (what the pipeline schedule needs).
  GPT2(const ModelConfig& config, int micro_batch, kernels::Kernels& k, TensorParallel tp = {},
       size_t buffer_multiple = 1, const StageSpec& stage = {}, int slots = 1);

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  TensorParallel& tensor_parallel() { return tp_; }
  int micro_batch() const { return B_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  float* params() const { return params_.data(); }
  float* grads() const { return grads_.data(); }
  float* param(int index) const { return params_.data() + layout_[index].offset; }
  float* grad(int index) const { return grads_.data() + layout_[index].offset; }
  // Call after writing params() directly (the optimizer does): the compute copy of the
  // weights is refreshed before the next forward pass.
  void parameters_changed() { weights_stale_ = true; }

  // GPT-2 initialization from a seed: normal(0, 0.02) weights and embeddings, residual
  // projections scaled by 1/sqrt(2 n_layer), zero biases, unit LayerNorm gains. Each
  // value depends only on (seed, tensor name, index), never on the layout.
  void init_parameters(uint64_t seed);

  // Copies a named parameter in its full canonical shape from the host into this
  // rank's shard.
  void set_parameter(const std::string& name, const float* host, size_t count);
  // The whole flat parameter buffer of this rank, to and from host memory.
  void copy_parameters_to_host(float* host) const { k_.copy_to_host(host, params_.data(), params_.size() * sizeof(float)); }
  void copy_parameters_from_host(const float* host) {
    k_.copy_to_device(params_.data(), host, params_.size() * sizeof(float));
    parameters_changed();
  }
  // The full canonical tensor (or its gradient), gathered over tp: collective.
  std::vector<float> get_parameter(const std::string& name, bool gradient = false);

  // Runs this stage's forward pass for a micro-batch in activation slot `slot`, on
  // tokens/targets [B, T] (host memory, B <= micro_batch): the first stage embeds the
  // tokens; a later stage reads its input from stage_input(slot), where the pipeline
  // put the previous stage's output. Keeps the activations for backward(). Returns the
  // mean loss on the last stage, 0 elsewhere (the output is then stage_output(slot)).
  float forward(int slot, const int32_t* tokens, const int32_t* targets, int B);
  // Adds d(loss_scale * sum of token losses)/d(params) into the gradients, for the
  // micro-batch in `slot`. For a mean over G sequences: loss_scale = 1/(G*T). A stage
  // other than the last starts from output_gradient(), filled by the pipeline; a stage
  // other than the first leaves d loss / d input in input_gradient().
  // grads_final_from(offset), if given, is called as soon as the gradients at
  // [offset, end) of the flat buffer are complete (the last layers come first), so that
  // their reduction can start while backward goes on.
  void backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from = {});
  // One stage, one slot.
  float forward(const int32_t* tokens, const int32_t* targets, int B) { return forward(0, tokens, targets, B); }
  void backward(float loss_scale, const std::function<void(size_t)>& grads_final_from = {}) {
    backward(0, loss_scale, grads_final_from);
  }
  void zero_grad();

  bool first_stage() const { return stage_.has_embedding; }
  bool last_stage() const { return stage_.has_head; }
  // Hidden states [B, T, d] entering / leaving this stage for the micro-batch in `slot`.
  ActivationSpan stage_input(int slot, int B) const { return hidden(slots_[slot].encoded, B); }
  ActivationSpan stage_output(int slot, int B) const { return hidden(layer_input(slot, layout_.layers()), B); }
  // Gradient buffers [B, T, d] of this stage's output (in) and input (out).
  ActivationSpan output_gradient(int B) const { return hidden(dresidual_, B); }
  ActivationSpan input_gradient(int B) const { return hidden(dresidual_, B); }

  // Activation bytes held for all slots, and of the weights' compute copy (for the memory report).
  size_t activation_bytes() const { return activation_bytes_; }
  size_t compute_weight_bytes() const { return weights_.size() * sizeof(float); }

 private:
  using Act = kernels::Act;
  // Activations (Act) and the fp32 statistics kept with them.
  struct LayerActivations {
    Act *ln_1, *qkv, *atty, *residual_2, *ln_2, *fc, *fc_gelu, *residual_3;
    float *ln_1_mean, *ln_1_rstd, *attention_stats, *ln_2_mean, *ln_2_rstd;
  };

  // One micro-batch's activations.
  struct Slot {
    int32_t *tokens = nullptr, *targets = nullptr;
    Act *encoded = nullptr, *ln_f = nullptr, *logits = nullptr;
    float *ln_f_mean = nullptr, *ln_f_rstd = nullptr, *losses = nullptr, *row_max = nullptr,
          *sum_and_target = nullptr, *lse = nullptr;
    std::vector<LayerActivations> layers;
    int B = 0;
  };

  void allocate_activations(int slots);
  // The residual stream entering local block l (l = layers(): the stage's output).
  Act* layer_input(int slot, int l) const;
  // The compute copy of parameter `index` (what the layers read).
  const Act* weight(int index) const { return kernels::offset(weights_act_, layout_[index].offset, act_type_); }
  ActivationSpan span(Act* x, size_t n) const { return {x, n, act_type_}; }
  ActivationSpan hidden(Act* x, int B) const { return span(x, static_cast<size_t>(B) * config_.seq_len * config_.d_model); }
  void refresh_weights();
  void block_forward(const Slot& s, int slot, int l);
  void block_backward(const Slot& s, int slot, int l, Act* dresidual);

  ModelConfig config_;
  StageSpec stage_;
  TensorParallel tp_;
  ParameterLayout layout_;
  int B_;
  kernels::Kernels& k_;
  // This rank's share: channels of attention (heads) and of the MLP, vocabulary rows.
  int C_local_, heads_local_, vocab_shard_, vocab_start_, vocab_valid_;
  DeviceBuffer params_, grads_;
  kernels::DType act_type_;
  DeviceBuffer weights_;  // the compute copy, when it is not params_ itself
  Act* weights_act_;
  bool weights_stale_ = true;

  DeviceBuffer activations_;  // one arena for everything below
  size_t activation_bytes_ = 0;
  std::vector<Slot> slots_;
  // Backward scratch, shared by all layers and slots.
  Act *dresidual_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr, *dfc_ = nullptr;
  std::vector<float> host_losses_;
};

}  // namespace trident
