// The parameters of a GPT-2 model as one flat float buffer with named views. Names
// and canonical shapes are those of shared/reference/FORMAT.md and are used
// everywhere (checkpoints, exports, verify); under tensor parallelism each rank stores
// its shard of a tensor, and `Sharding` says which part (Megatron's layout). Tensors are
// laid out layer by layer, so a layer's parameters (and gradients) are contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace trident {

enum class Sharding {
  replicated,  // every tp rank holds all of it (LayerNorms, wpe, row-parallel biases)
  rows,        // split by rows (dim 0): column-parallel c_fc, vocabulary-parallel wte
  qkv_rows,    // c_attn: rows split within each of the q, k, v blocks (heads over tp)
  columns,     // split by columns (dim 1): row-parallel c_proj weights
};

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;  // canonical (full, unpadded) shape, e.g. wte.weight [V, d]
  std::vector<int64_t> padded_shape;  // full shape with padding rows (wte: [Vp, d])
  Sharding sharding = Sharding::replicated;
  size_t offset = 0;           // in floats, into this rank's flat buffer
  size_t stored = 0;           // floats this rank stores
  bool weight_decay = false;   // AdamW decays tensors of 2 or more dimensions

  size_t numel() const;  // of the canonical tensor
  bool sharded() const { return sharding != Sharding::replicated; }
};

// The part of the model that one pipeline stage holds: a contiguous range of blocks,
// the embeddings on the first stage, the final LayerNorm and the tied head on the last.
// The default is the whole model.
struct StageSpec {
  int first_layer = 0;
  int layers = -1;  // -1: all
  bool has_embedding = true, has_head = true;
};

// Where each parameter of one block lives, for the layer code.
struct BlockParameterIndex {
  int ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, attn_c_proj_weight, attn_c_proj_bias,
      ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_c_proj_weight, mlp_c_proj_bias;
};

class ParameterLayout {
 public:
  // The layout of pipeline stage `stage` on tp rank `tp_rank` of `tp_size`.
  // total_floats() is rounded up to a multiple of `pad_to` (data parallelism splits the
  // buffer into equal blocks). wte sits on the first and on the last stage (tied).
  ParameterLayout(const ModelConfig& model, int tp_rank = 0, int tp_size = 1, size_t pad_to = 1,
                  const StageSpec& stage = {});

  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;
  const ParameterTensor& operator[](int index) const { return tensors_[index]; }
  size_t total_floats() const { return total_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  // This rank's shard of a full canonical tensor (host memory), padding rows as zeros.
  std::vector<float> shard_of(const ParameterTensor& t, const float* full) const;
  // The full canonical tensor from every rank's shard, in tp rank order.
  std::vector<float> assemble(const ParameterTensor& t, const std::vector<float>& all_shards) const;

  bool has(const std::string& name) const;
  // Indices into tensors(); -1 where this stage does not hold the tensor.
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int ln_f_weight() const { return ln_f_weight_; }
  int ln_f_bias() const { return ln_f_bias_; }
  // Block `local` of this stage (global layer first_layer() + local).
  const BlockParameterIndex& block(int local) const { return blocks_[local]; }
  int first_layer() const { return first_layer_; }
  int layers() const { return static_cast<int>(blocks_.size()); }

 private:
  int add(const std::string& name, std::vector<int64_t> shape, Sharding sharding, int64_t padded_rows = 0);
  // Calls copy(full_row, shard_row, first_column, columns) for every row of rank r's shard.
  template <typename F>
  void for_each_shard_row(const ParameterTensor& t, int r, F copy) const;

  std::vector<ParameterTensor> tensors_;
  std::vector<BlockParameterIndex> blocks_;
  int wte_ = -1, wpe_ = -1, ln_f_weight_ = -1, ln_f_bias_ = -1, first_layer_ = 0;
  int tp_rank_ = 0, tp_size_ = 1;
  size_t total_ = 0;
};

}  // namespace trident
