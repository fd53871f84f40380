// The parameters of a transformer as one flat float buffer with named views. Each layer
// declares its tensors (model/layers/layer.h): names and canonical shapes are those of
// shared/reference/FORMAT.md, chosen by the model's family (model/families/), and are used
// everywhere (checkpoints, exports, verify); each tensor's placement (model/placement.h)
// says how it is cut over tp, how its gradient is completed and what the optimizer and
// ZeRO do with it. Tensors are laid out layer by layer, so a layer's parameters (and
// gradients) are contiguous; the tensors that one GEMM reads side by side (q | k | v,
// gate | up) are adjacent, without padding. A layer's buffers (StateKind::buffer: state it
// keeps but no optimizer trains) are declared the same way and laid out apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/placement.h"
#include "model/transformer_spec.h"
#include "runtime/flat_range.h"

namespace trident {

// How a parameter starts (its layer decides; values depend on (seed, name, index) only).
enum class Init { zeros, ones, normal, normal_residual };

// The kinds of declared state. A parameter is trained: it has a gradient, a compute copy
// and optimizer state, in the flat parameter buffer. A buffer is state a layer keeps and
// updates itself between steps, never optimized (loss-free balancing's expert bias; an
// FP8 amax history, a running count next): fp32, in a flat buffer of its own, held whole
// by every rank its placement replicates it over, and updated alike on each of them from
// figures summed over its summed_over axes. The third kind, the optimizer's state, is
// the optimizer's to declare (optim/optimizer.h). Each is checkpointed, resharded on load,
// counted by the memory plan and compared by the replica check from its declaration.
enum class StateKind { parameter, buffer };

// A tensor as a layer declares it (model/layers/layer.h): its name and canonical shape,
// how it is cut over tp and completed after backward, how it starts. The layout adds
// where it lies and which piece this rank holds.
struct TensorDeclaration {
  std::string name;
  std::vector<int64_t> shape;  // canonical (full, unpadded), e.g. wte.weight [V, d]
  Sharding sharding = Sharding::replicated;
  int pieces = 1;              // distinct pieces over tp (the tp size, or fewer shared ones)
  Init init = Init::normal;
  int64_t padded_rows = 0;     // rows with padding (a vocabulary table's), 0: none
  bool adjacent = false;       // right after the previous tensor, no padding: one GEMM reads both
  bool multiplied = true;      // false: only looked up (Placement::multiplied)
  double active = 1.0;         // the share of tokens it multiplies (Placement::active)
  // Over the mesh (Placement): beyond tp's cut, the axes it is sharded over (an expert: ep),
  // and those its gradient is summed over (tp_piece is added by the layout).
  AxisSet sharded_over = {};
  AxisSet summed_over = kDataParallel;
  StateKind kind = StateKind::parameter;
  // A block's weight matrix applied to the hidden states (attention's and the MLP's
  // projections, each expert's): what Muon orthogonalizes whole. Not the embeddings, the
  // head or a router (classifiers over the vocabulary, the experts), norms or biases.
  bool hidden_matrix = false;
};

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;         // canonical (full, unpadded) shape, e.g. wte.weight [V, d]
  std::vector<int64_t> padded_shape;  // full shape with padding rows (wte: [Vp, d])
  Placement placement;
  size_t offset = 0;            // in floats, into this rank's flat buffer
  size_t stored = 0;            // floats this rank stores
  Init init = Init::normal;

  size_t numel() const;  // of the canonical tensor
  bool sharded() const { return placement.sharded(); }
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
  // Expert parallelism (parallel/parallel_dims.h): of a mixture's E experts, this rank
  // holds E / ep, those of ep rank ep_rank.
  int ep_rank = 0, ep = 1;
  // ZeRO-3 with the ends in the blocks' windows (parallel/param_grad_store.h; not under
  // deferred weight gradients): an end that may take them (ends_for_windows()) and is at
  // least 3/4 of a block is padded to a block's size, so that its gradient reduction is a
  // block's message size (Open MPI's temporaries of one size reuse each other's memory).
  bool windowed_ends = false;
};

struct StageLayers;

class ParameterLayout {
 public:
  // The layout of pipeline stage `stage` on tp rank `tp_rank` of `tp_size`: the tensors
  // its layers declare (made by the model's family, model/families/), in their order.
  // total_floats() is rounded up to a multiple of `pad_to` (data parallelism splits the
  // buffer into equal blocks). A tied token embedding sits on the first and on the last
  // stage.
  ParameterLayout(const TransformerSpec& spec, int tp_rank = 0, int tp_size = 1, size_t pad_to = 1,
                  const StageSpec& stage = {});
  explicit ParameterLayout(const ModelConfig& model, int tp_rank = 0, int tp_size = 1)
      : ParameterLayout(transformer_spec(model), tp_rank, tp_size) {}
  // The same for these layers of the stage, which keep the indices of their tensors.
  ParameterLayout(StageLayers& layers, const TransformerSpec& spec, int tp_rank, int tp_size, size_t pad_to,
                  const StageSpec& stage);

  const TransformerSpec& spec() const { return spec_; }
  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;
  const ParameterTensor& operator[](int index) const { return tensors_[index]; }
  size_t total_floats() const { return total_; }
  // The buffers its layers declared (StateKind::buffer), each at its offset in a flat
  // buffer of buffer_floats() floats of its own; the placement as a parameter's.
  const std::vector<ParameterTensor>& buffers() const { return buffers_; }
  size_t buffer_floats() const { return buffer_total_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  // This rank's shard of a full canonical tensor (host memory), padding rows as zeros.
  std::vector<float> shard_of(const ParameterTensor& t, const float* full) const;
  // The same into `out` (t.stored floats), the full tensor read piecewise: read(first,
  // n, out) copies its flat elements [first, first + n), always within one row, so that
  // a file reader fetches only this rank's slice.
  using ReadFull = std::function<void(int64_t first, int64_t n, float* out)>;
  void shard_into(const ParameterTensor& t, const ReadFull& read, float* out) const;
  // The full canonical tensor from its t.placement.pieces pieces, in piece order.
  std::vector<float> assemble(const ParameterTensor& t, const std::vector<float>& pieces) const;

  bool has(const std::string& name) const;
  // The buffer `name`; null where this stage holds none of that name.
  const ParameterTensor* find_buffer(const std::string& name) const;
  // The index of tensor `name` in tensors(); -1 where this stage does not hold it.
  int index_of(const std::string& name) const;
  // The model's layer that local block `local` is; local blocks count up through the
  // chunks in order (ascending global layers).
  int global_layer(int local) const { return global_layers_[local]; }
  int layers() const { return static_cast<int>(global_layers_.size()); }
  // The stage's model chunks: chunk c is local blocks [chunk_begin(c), chunk_begin(c + 1)).
  int chunks() const { return static_cast<int>(chunk_begin_.size()) - 1; }
  int chunk_begin(int chunk) const { return chunk_begin_[chunk]; }
  // The flat buffer cut into units, in order: the embeddings (if any), each block, the
  // final norm and head (if any); each a multiple of pad_to floats. Block `local` is
  // units()[block_unit(local)].
  const std::vector<FlatRange>& units() const { return units_; }
  int block_unit(int local) const { return block_units_[local]; }
  // Per unit: whether it is a block (gathered per use under ZeRO-3; the others, the
  // embeddings, the final norm and the head, where they fit a block's window:
  // ParamGradStore::windowed_units).
  const std::vector<bool>& unit_is_block() const { return unit_is_block_; }
  // The units the model's ends read (-1 where the stage has none): the embeddings' (not a
  // last stage's copy of a tied table), and the final norm and head's. A tied head on a
  // stage that also embeds reads the table from the embeddings' unit
  // (head_reads_embedding_unit()).
  int embedding_unit() const { return embedding_unit_; }
  int head_unit() const { return head_unit_; }
  bool head_reads_embedding_unit() const { return spec_.tied_head && embedding_unit_ >= 0 && head_unit_ >= 0; }
  // The ends that may share the blocks' two windows under ZeRO-3: no larger than a block,
  // with two blocks or more to alternate with, and whose gradient is complete at their use
  // (not a tied table summed between the pipeline's ends after backward). A tied head on a
  // stage that embeds reads the embeddings' unit; its own (the final norm alone) is not one.
  std::vector<int> ends_for_windows() const;
  size_t largest_block() const;  // floats
  // The unit holding flat offset `offset` (an index into units()); check-fails outside.
  size_t unit_of(size_t offset) const;
  // Expert parallelism: this rank's share of the experts (the MoE layer's declarations).
  int ep_rank() const { return ep_rank_; }
  int ep_size() const { return ep_; }
  // Where the tensors lie that data parallelism reduces over other ranks than dp x cp (an
  // expert's: edp), one region per set of data axes: runs each starting and ending at a
  // multiple of pad_to (empty where every tensor is summed over dp x cp).
  struct DataRegion {
    AxisSet axes;
    std::vector<FlatRange> ranges;
  };
  const std::vector<DataRegion>& data_regions() const { return data_regions_; }
  // Every region's ranges, in order: where a reduction's pieces are cut (split_at).
  std::vector<FlatRange> region_ranges() const;
  // The data axes of a piece that lies within one region or outside them all (split_at's).
  AxisSet data_axes_of(const FlatRange& piece) const;

 private:
  friend class ParameterDeclarations;
  // Adds a declared tensor at the end of the buffer (ParameterDeclarations::add).
  int add(const TensorDeclaration& declared, ZeroResidence zero);
  // Grows unit u to `floats` (StageSpec::windowed_ends).
  void pad_unit(size_t u, size_t floats);
  // Calls copy(full_row, shard_row, first_column, columns) for every row of piece p.
  template <typename F>
  void for_each_shard_row(const ParameterTensor& t, int p, F copy) const;

  TransformerSpec spec_;
  std::vector<ParameterTensor> tensors_, buffers_;
  size_t buffer_total_ = 0;
  std::vector<int> global_layers_, chunk_begin_;
  std::vector<FlatRange> units_;
  std::vector<int> block_units_;
  std::vector<bool> unit_is_block_;
  int embedding_unit_ = -1, head_unit_ = -1;
  // Whether data parallelism sums tensors of these data axes over different ranks.
  bool reduced_apart(AxisSet a, AxisSet b) const;
  std::vector<DataRegion> data_regions_;
  int tp_rank_ = 0, tp_size_ = 1, ep_rank_ = 0, ep_ = 1;
  bool has_embedding_ = true;
  size_t total_ = 0, unit_align_ = 16;
};

// What a layer declares its tensors into while its stage's layout is built: each added
// after the previous one (the order of the layers, and of each layer's tensors).
class ParameterDeclarations {
 public:
  ParameterDeclarations(ParameterLayout& layout, ZeroResidence zero) : layout_(layout), zero_(zero) {}
  // The tensor's index in the layout (in buffers() for a buffer); the layout sets its
  // placement for this rank.
  int add(const TensorDeclaration& tensor) { return layout_.add(tensor, zero_); }
  // A tensor declared before (a head tied to the token embedding); -1 if none.
  int find(const std::string& name) const { return layout_.index_of(name); }
  // Where buffer `index` (add's answer for a StateKind::buffer) lies in the stage's buffers.
  size_t buffer_offset(int index) const { return layout_.buffers()[index].offset; }
  int tp_rank() const { return layout_.tp_rank(); }
  int tp_size() const { return layout_.tp_size(); }
  int ep_rank() const { return layout_.ep_rank(); }
  int ep_size() const { return layout_.ep_size(); }

 private:
  ParameterLayout& layout_;
  ZeroResidence zero_;
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
