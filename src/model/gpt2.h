// GPT-2 with explicit forward and backward passes, layer by layer, over the kernel API
// (kernels/kernels.h), so the same model runs on any backend. It owns its parameters,
// gradients and one micro-batch of activations, all allocated once at construction.
// Under tensor parallelism each rank holds its shard (model/parameters.h): heads and MLP
// columns split Megatron-style, the vocabulary split for the embedding and the loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/config.h"
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
  // parameter and gradient buffers are padded to a multiple.
  GPT2(const ModelConfig& config, int micro_batch, kernels::Kernels& k, TensorParallel tp = {},
       size_t buffer_multiple = 1);

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  TensorParallel& tensor_parallel() { return tp_; }
  int micro_batch() const { return B_; }
  float* params() const { return params_.data(); }
  float* grads() const { return grads_.data(); }
  float* param(int index) const { return params_.data() + layout_[index].offset; }
  float* grad(int index) const { return grads_.data() + layout_[index].offset; }

  // GPT-2 initialization from a seed: normal(0, 0.02) weights and embeddings, residual
  // projections scaled by 1/sqrt(2 n_layer), zero biases, unit LayerNorm gains. Each
  // value depends only on (seed, tensor name, index), never on the layout.
  void init_parameters(uint64_t seed);

  // Copies a named parameter in its full canonical shape from the host into this
  // rank's shard.
  void set_parameter(const std::string& name, const float* host, size_t count);
  // The full canonical tensor (or its gradient), gathered over tp: collective.
  std::vector<float> get_parameter(const std::string& name, bool gradient = false);

  // Runs the forward pass on tokens/targets [B, T] (host memory, B <= micro_batch)
  // and keeps the activations for backward(). Returns the mean loss.
  float forward(const int32_t* tokens, const int32_t* targets, int B);
  // Adds d(loss_scale * sum of token losses)/d(params) into the gradients, for the
  // batch of the last forward(). For a mean over G sequences: loss_scale = 1/(G*T).
  // grads_final_from(offset), if given, is called as soon as the gradients at
  // [offset, end) of the flat buffer are complete (the last layers come first), so that
  // their reduction can start while backward goes on.
  void backward(float loss_scale, const std::function<void(size_t)>& grads_final_from = {});
  void zero_grad();

  // Activation floats held for one micro-batch (for the memory report).
  size_t activation_floats() const { return activation_floats_; }

 private:
  struct LayerActivations {
    float *ln_1, *ln_1_mean, *ln_1_rstd, *qkv, *atty, *probs, *residual_2, *ln_2, *ln_2_mean,
        *ln_2_rstd, *fc, *fc_gelu, *residual_3;
  };

  void allocate_activations();
  // The residual stream entering layer l.
  float* layer_input(int l) const;
  void block_forward(int l, int B);
  void block_backward(int l, int B, float* dresidual);

  ModelConfig config_;
  TensorParallel tp_;
  ParameterLayout layout_;
  int B_;
  kernels::Kernels& k_;
  // This rank's share: channels of attention (heads) and of the MLP, vocabulary rows.
  int C_local_, heads_local_, vocab_shard_, vocab_start_, vocab_valid_;
  DeviceBuffer params_, grads_;

  DeviceBuffer activations_;  // one arena for everything below
  size_t activation_floats_ = 0;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  float *encoded_ = nullptr, *ln_f_ = nullptr, *ln_f_mean_ = nullptr, *ln_f_rstd_ = nullptr,
        *logits_ = nullptr, *losses_ = nullptr, *row_max_ = nullptr, *sum_and_target_ = nullptr, *lse_ = nullptr;
  std::vector<LayerActivations> layers_;
  // Backward scratch, shared by all layers.
  float *dresidual_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr, *dfc_ = nullptr;
  int last_B_ = 0;
  std::vector<float> host_losses_;
};

}  // namespace trident
