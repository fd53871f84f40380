// The parameters of a GPT-2 model as one flat float buffer with named views. Names
// and canonical shapes are those of shared/reference/FORMAT.md and are used
// everywhere (checkpoints, exports, verify). Tensors are laid out layer by layer so a
// layer's parameters (and gradients) are contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace trident {

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;  // canonical shape, e.g. wte.weight [V, d]
  size_t offset = 0;           // in floats, into the flat buffer
  size_t stored = 0;           // floats stored: >= numel() when rows are padded (wte)
  bool weight_decay = false;   // AdamW decays tensors of 2 or more dimensions

  size_t numel() const;
};

// Where each parameter of one block lives, for the layer code.
struct BlockParameterIndex {
  int ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, attn_c_proj_weight, attn_c_proj_bias,
      ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_c_proj_weight, mlp_c_proj_bias;
};

class ParameterLayout {
 public:
  // total_floats() is rounded up to a multiple of `pad_to` (data parallelism splits the
  // buffer into equal blocks).
  explicit ParameterLayout(const ModelConfig& model, size_t pad_to = 1);

  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;
  const ParameterTensor& operator[](int index) const { return tensors_[index]; }
  size_t total_floats() const { return total_; }

  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int ln_f_weight() const { return ln_f_weight_; }
  int ln_f_bias() const { return ln_f_bias_; }
  const BlockParameterIndex& block(int layer) const { return blocks_[layer]; }

 private:
  int add(const std::string& name, std::vector<int64_t> shape, size_t stored = 0);

  std::vector<ParameterTensor> tensors_;
  std::vector<BlockParameterIndex> blocks_;
  int wte_ = 0, wpe_ = 0, ln_f_weight_ = 0, ln_f_bias_ = 0;
  size_t total_ = 0;
};

}  // namespace trident
