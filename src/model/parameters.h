// The parameters of a transformer as one flat float buffer with named views. Names and
// canonical shapes are those of shared/reference/FORMAT.md, chosen by the family's spec
// (model/transformer_spec.h), and are used everywhere (checkpoints, exports, verify).
// Under tensor parallelism each rank stores its shard of a tensor; `Sharding` says how a
// tensor is cut (Megatron's layout) and into how many pieces. Tensors are laid out
// layer by layer, so a layer's parameters (and gradients) are contiguous; the tensors
// that one GEMM reads side by side (q | k | v, gate | up) are adjacent, without padding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/transformer_spec.h"
#include "runtime/flat_range.h"

namespace trident {

enum class Sharding {
  replicated,  // every tp rank holds all of it (norms, wpe, row-parallel biases)
  rows,        // split by rows (dim 0): column-parallel q/k/v, c_fc, gate/up; vocabulary-parallel tables
  qkv_rows,    // GPT-2's fused c_attn: rows split within each of the q, k, v blocks (heads over tp)
  columns,     // split by columns (dim 1): row-parallel c_proj, o_proj, down_proj weights
};

// How a parameter starts (the spec decides; values depend on (seed, name, index) only).
enum class Init { zeros, ones, normal, normal_residual };

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;         // canonical (full, unpadded) shape, e.g. wte.weight [V, d]
  std::vector<int64_t> padded_shape;  // full shape with padding rows (wte: [Vp, d])
  Sharding sharding = Sharding::replicated;
  // Distinct pieces over tp (1 when replicated). Fewer than tp: consecutive groups of
  // tp / shards ranks hold the same piece (a key/value head shared by several ranks).
  int shards = 1;
  int shard = 0;                // the piece this rank holds
  // The ranks holding one piece each compute part of its gradient (a shared key/value
  // head sees only this rank's query heads): summed over them after backward.
  bool partial_gradient = false;
  // A norm's gain or bias: its gradient sums over the B*T rows, of which each rank sees
  // 1/tp under sequence parallelism: summed over tp then.
  bool is_norm_parameter = false;
  // A second copy of a tensor that another stage holds too (the tied wte on the last
  // pipeline stage): kept in step with it, never counted or saved.
  bool tied_copy = false;
  // This rank's copy is the one that counts (gradient norm, checkpoints): its piece's
  // first holder, and not a tied copy.
  bool counted = true;
  size_t offset = 0;            // in floats, into this rank's flat buffer
  size_t stored = 0;            // floats this rank stores
  bool weight_decay = false;    // AdamW decays tensors of 2 or more dimensions
  Init init = Init::normal;

  size_t numel() const;  // of the canonical tensor
  bool sharded() const { return shards > 1; }
};

// The part of the model that one pipeline stage holds: one or more ranges of blocks (its
// model chunks: several under the interleaved schedule, pipeline/schedule.h), the
// embeddings on the first stage, the final norm and the head on the last. The default is
// the whole model.
struct LayerRange {
  int first = 0;
  int count = -1;  // -1: to the last layer
};
struct StageSpec {
  std::vector<LayerRange> chunks = {LayerRange{}};  // in the order of their virtual stages
  bool has_embedding = true, has_head = true;
};

// Where each parameter of one block lives, for the layer code; -1: the family has none.
// qkv and mlp_in are the first of the tensors their GEMM reads side by side.
struct BlockParameterIndex {
  int first;  // the block's first tensor: its gradients start there
  int norm_1_weight, norm_1_bias, qkv_weight, qkv_bias, attn_out_weight, attn_out_bias;
  int norm_2_weight, norm_2_bias, mlp_in_weight, mlp_in_bias, mlp_out_weight, mlp_out_bias;
};

class ParameterLayout {
 public:
  // The layout of pipeline stage `stage` on tp rank `tp_rank` of `tp_size`.
  // total_floats() is rounded up to a multiple of `pad_to` (data parallelism splits the
  // buffer into equal blocks). A tied token embedding sits on the first and on the last
  // stage.
  ParameterLayout(const TransformerSpec& spec, int tp_rank = 0, int tp_size = 1, size_t pad_to = 1,
                  const StageSpec& stage = {});
  explicit ParameterLayout(const ModelConfig& model, int tp_rank = 0, int tp_size = 1)
      : ParameterLayout(transformer_spec(model), tp_rank, tp_size) {}

  const TransformerSpec& spec() const { return spec_; }
  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;
  const ParameterTensor& operator[](int index) const { return tensors_[index]; }
  size_t total_floats() const { return total_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  // This rank's shard of a full canonical tensor (host memory), padding rows as zeros.
  std::vector<float> shard_of(const ParameterTensor& t, const float* full) const;
  // The same into `out` (t.stored floats), the full tensor read piecewise: read(first,
  // n, out) copies its flat elements [first, first + n), always within one row, so that
  // a file reader fetches only this rank's slice.
  using ReadFull = std::function<void(int64_t first, int64_t n, float* out)>;
  void shard_into(const ParameterTensor& t, const ReadFull& read, float* out) const;
  // The full canonical tensor from its t.shards pieces, in piece order.
  std::vector<float> assemble(const ParameterTensor& t, const std::vector<float>& pieces) const;

  bool has(const std::string& name) const;
  // Indices into tensors(); -1 where this stage does not hold the tensor.
  int token_embedding() const { return token_embedding_; }
  int position_embedding() const { return position_embedding_; }
  int final_norm_weight() const { return final_norm_weight_; }
  int final_norm_bias() const { return final_norm_bias_; }
  int head() const { return head_; }  // the token embedding itself when tied
  // The tensor that the first and the last stage both hold and keep equal (the tied
  // embedding), when this stage holds it; -1 otherwise.
  int tied_across_stages() const { return tied_; }
  // Block `local` of this stage, and the model's layer it is; local blocks count up
  // through the chunks in order (ascending global layers).
  const BlockParameterIndex& block(int local) const { return blocks_[local]; }
  int global_layer(int local) const { return global_layers_[local]; }
  int layers() const { return static_cast<int>(blocks_.size()); }
  // The stage's model chunks: chunk c is local blocks [chunk_begin(c), chunk_begin(c + 1)).
  int chunks() const { return static_cast<int>(chunk_begin_.size()) - 1; }
  int chunk_begin(int chunk) const { return chunk_begin_[chunk]; }
  // The flat buffer cut into units, in order: the embeddings (if any), each block, the
  // final norm and head (if any); each a multiple of pad_to floats. Block `local` is
  // units()[block_unit(local)].
  const std::vector<FlatRange>& units() const { return units_; }
  int block_unit(int local) const { return block_units_[local]; }
  // Per unit: whether it is a block (the others: embeddings, final norm and head).
  const std::vector<bool>& unit_is_block() const { return unit_is_block_; }
  // The unit holding flat offset `offset` (an index into units()); check-fails outside.
  size_t unit_of(size_t offset) const;

 private:
  // Adds a tensor cut into `shards` pieces; `adjacent`: right after the previous one,
  // without alignment padding (one GEMM reads both).
  int add(const std::string& name, std::vector<int64_t> shape, Sharding sharding, int shards, Init init,
          int64_t padded_rows = 0, bool adjacent = false);
  // Calls copy(full_row, shard_row, first_column, columns) for every row of piece p.
  template <typename F>
  void for_each_shard_row(const ParameterTensor& t, int p, F copy) const;

  TransformerSpec spec_;
  std::vector<ParameterTensor> tensors_;
  std::vector<BlockParameterIndex> blocks_;
  std::vector<int> global_layers_, chunk_begin_;
  std::vector<FlatRange> units_;
  std::vector<int> block_units_;
  std::vector<bool> unit_is_block_;
  int token_embedding_ = -1, position_embedding_ = -1, final_norm_weight_ = -1, final_norm_bias_ = -1, head_ = -1,
      tied_ = -1;
  int tp_rank_ = 0, tp_size_ = 1;
  size_t total_ = 0;
};

// What checkpoints and initializers see of a model: its named, sharded tensors (the
// layout) over the flat parameter buffer in a kernel backend's memory. Not the model.
// Under ZeRO-3 this rank holds only its pieces of the flat buffer (`held`, in order, one
// after the other at `values`): writes keep what falls inside them, reads give zeros
// elsewhere (the other ranks' pieces complete them).
struct ShardedParameters {
  const ParameterLayout* layout = nullptr;
  float* values = nullptr;              // layout->total_floats() floats, or the held pieces
  kernels::Kernels* memory = nullptr;   // whose memory holds them
  std::function<void()> changed;        // to call after writing values
  std::vector<FlatRange> held;          // ZeRO-3: the ranges held; empty: all of it

  bool sharded() const { return !held.empty(); }
  // Copies a full canonical tensor from the host into this rank's shard of it.
  void set(const ParameterTensor& t, const float* full) const;
  // Copies this rank's shard (t.stored floats, host memory) into place, and back out
  // (sharded: zeros where another rank holds it).
  void set_shard(const ParameterTensor& t, const float* shard) const;
  void shard_to_host(const ParameterTensor& t, float* shard) const;
  // Where the shard lives when that is host memory (a reader can write it in place), else null.
  float* host_shard(const ParameterTensor& t) const {
    return memory->host_memory() && !sharded() ? values + t.offset : nullptr;
  }
  // The whole flat buffer from / into host memory (total_floats() floats); sharded: the
  // held ranges only, zeros elsewhere on the way out.
  void to_host(float* flat) const;
  void from_host(const float* flat) const;
};

}  // namespace trident
