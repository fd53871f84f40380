// The parameters and gradients of one rank's model stage, stored as its ZeRO stage
// asks (cf. Megatron-Core's param_and_grad_buffer.py; as torchtitan applies FSDP from
// outside the model, the sharding lives here and the layers only ask for a tensor).
// - Parameters: the flat fp32 layout (model/parameters.h), and the compute copy of the
//   weights that the layers read, in the activation type (bf16; in fp32 the copy is the
//   parameters themselves), refreshed whenever the parameters change.
// - Gradients: the flat layout, or from ZeRO-2 the kept units (embeddings, final norm
//   and head) and two windows that blocks of alternate parity reuse, each reduced away
//   (parallel/data_parallel.h) before the block two below needs it.
// - ZeRO-3 (FSDP's FULL_SHARD): each layout unit is cut into one piece per rank of the
//   shard group (rank r holds piece r, as ZeRO's gradient shards): the fp32 masters that
//   the optimizer updates. The parameters are stored as the gradients are: a block's
//   are all-gathered into one of two windows before its forward and again before its
//   backward (unless still there), the next block's gather issued ahead. The embeddings
//   and the head take the windows too when they fit one (no larger than a block; one close
//   to a block's size is padded to it, StageSpec::windowed_ends), so that they are sharded
//   at rest as FSDP reshards any module after use: the units are used in the order
//   embeddings (position -1), blocks 0 .. L-1, head (position L), and position p's unit
//   is in window p mod 2. A tied table is read at both ends (gathered at each) and its
//   gradient comes in two parts (reduced at each). Ends that do not fit, a pipeline's tied
//   table (on its first and last stage: summed between them after the step's backward)
//   and any end when weight gradients are deferred (zb1) are kept gathered after each
//   update, as FSDP2 keeps its root module unsharded (ParameterLayout::ends_for_windows
//   says which ends may take the windows). In bf16 what
//   is gathered is the compute copy (half the bytes, as FSDP's bf16 param_dtype): no
//   fp32 parameters are stored besides the masters.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/parameters.h"
#include "parallel/communicator.h"
#include "parallel/zero_stage.h"
#include "runtime/flat_range.h"

namespace trident {

class ParamGradStore {
 public:
  using Act = kernels::Act;

  // The storage of `layout` (kept by reference: it must outlive the store) in k's memory.
  // shard_group: the ranks ZeRO-3 shards the parameters over; with none, or one rank,
  // they are whole here (the gradients are still windowed from ZeroStage::gradients).
  // region_groups: the group of a region of the layout that data parallelism reduces over
  // other ranks than dp x cp (ParameterLayout::data_regions: an ep shard's, the ranks holding
  // it), which shards that region's tensors instead.
  // defers_weight_gradients: the model computes weight gradients apart from the backward
  // pass (zb1): the ends stay kept gathered.
  ParamGradStore(const ParameterLayout& layout, kernels::Kernels& k, ZeroStage zero, Communicator* shard_group,
                 GroupOf region_groups = {}, bool defers_weight_gradients = false);
  ParamGradStore(const ParamGradStore&) = delete;
  ParamGradStore& operator=(const ParamGradStore&) = delete;

  // Per unit of `layout`: whether it lives in the two windows under `zero` (ZeRO-2: the
  // blocks' gradients; ZeRO-3: the blocks, and the ends that fit, parameters and gradients).
  // ZeRO-3 here means sharded over two ranks or more (the store applies ZeRO-2 otherwise).
  static std::vector<bool> windowed_units(const ParameterLayout& layout, ZeroStage zero,
                                          bool defers_weight_gradients = false);
  // What the storage of `layout` takes under `zero`, for memory plans: the gradients
  // (windowed from ZeRO-2), the fp32 parameters (ZeRO-3: stored as the gradients; none
  // in bf16), and the elements of the compute copy (ZeRO-3: stored as the gradients).
  static size_t gradient_floats_for(const ParameterLayout& layout, ZeroStage zero,
                                    bool defers_weight_gradients = false);
  static size_t parameter_floats_for(const ParameterLayout& layout, ZeroStage zero, kernels::Precision precision,
                                     bool defers_weight_gradients = false);
  static size_t compute_weight_floats_for(const ParameterLayout& layout, ZeroStage zero,
                                          bool defers_weight_gradients = false);

  bool parameters_sharded() const { return shards_ != nullptr; }

  // ---- what the layers read and write ----
  // The compute copy of tensor `index`; null for -1 (a tensor the family lacks). Under
  // ZeRO-3 a windowed unit's tensors are there from its use_*() until its window's next.
  const Act* weight(int index) const {
    if (index < 0) return nullptr;
    return kernels::offset(weights_act_, shards_ != nullptr ? stored_at(index) : layout_[index].offset, act_type_);
  }
  // Where backward adds the gradient of tensor `index` (null for -1).
  float* grad(int index) const { return index < 0 ? nullptr : grads_.data() + stored_at(index); }
  // Before a forward pass: the compute copy brought up to date with the parameters
  // (ZeRO-3: the kept units gathered).
  void refresh_weights();
  // ZeRO-3 (nothing otherwise), in the order of use: makes the unit at a position ready in
  // its window, and starts gathering the next one ahead into the other window, whose unit
  // is done with. use_block(l, next): local block l, next a block or layers() (the head).
  void use_embeddings();  // its forward (block 0 on its way)
  void use_block(int l, int next);
  void use_head();        // its forward and its backward
  // Before the embedding's backward: its gradients go to its own window (its weights are
  // not read, so not gathered).
  void embedding_takes_gradients();
  // The windowed unit used at `position` (-1 the embeddings, layers() the head; a tied
  // head's is the embeddings'), or -1 where it is kept (or absent).
  int windowed_unit_at(int position) const;
  const std::vector<bool>& windowed() const { return windowed_; }
  // The windowed unit used at both ends (a tied table), whose gradients are reduced twice
  // per micro-batch; -1: none.
  int unit_reduced_twice() const {
    const int u = windowed_unit_at(-1);
    return u >= 0 && u == windowed_unit_at(layout_.layers()) ? u : -1;
  }
  // Lets the gathers in flight move on: MPI moves a non-blocking operation on only inside
  // MPI calls, so without this the next block's gather would wait for the next wait.
  void progress_gathers();

  // ---- what the optimizer, data parallelism and checkpoints use ----
  // The flat parameters (not under ZeRO-3: there the storage holds the kept units and
  // two windows, as the gradients', and in bf16 none at all; parameter_at() is where
  // the values are).
  float* params() const { return params_.data(); }
  // Where the value of flat offset `offset` lives that the optimizer updates: in
  // params(), or under ZeRO-3 in this rank's shard (offset must be in held()).
  float* parameter_at(size_t offset) const;
  // ZeRO-3: the ranges of the flat layout this rank's shard holds (its block of each unit,
  // with data regions of each piece of a unit: a region's tensors and the rest).
  const std::vector<FlatRange>& held() const { return held_; }
  // Call after writing the parameters directly (the optimizer does): the compute copy
  // is refreshed before the next forward pass.
  void parameters_changed();
  // The named, sharded tensors over the parameters, for checkpoints and initializers.
  ShardedParameters parameters();
  // This rank's tp shard of tensor `index` (t.stored floats, host memory); under ZeRO-3
  // completed over the shard group (collective).
  std::vector<float> parameter_to_host(int index);
  std::vector<float> gradient_to_host(int index) const;

  // The gradient storage: the whole flat layout, or windowed the kept units and the two
  // windows (gradient_location() maps a flat offset into it, where its unit is now).
  float* grads() const { return grads_.data(); }
  // Where the gradient of flat offset `offset` lives (a block's: in its window).
  float* gradient_location(size_t offset) const;
  void zero_grad();

  // The bytes of the compute copy when it is not the parameters themselves (memory report).
  size_t compute_weight_bytes() const { return weights_.size() * sizeof(float); }

 private:
  // Where tensor `index` starts in the storage: its unit's place now, plus its offset in it.
  size_t stored_at(int index) const { return unit_storage_[tensor_unit_[index]] + within_unit_[index]; }
  // Unit u's parameters (in bf16 its compute copy) from every rank's piece into their
  // storage; returns the gather in flight.
  RequestPtr gather_unit(size_t u);
  // The unit at `position` into window position mod 2 (its gather started unless it is
  // there or on its way); with `wait`, until it is there.
  void gather_at(int position, bool wait);
  // Unit u now lives in window w (its parameters and gradients).
  void place(int u, int w) { unit_storage_[u] = window_start_[w]; }
  static int window_of(int position) { return position & 1; }  // -1: 1

  const ParameterLayout& layout_;
  kernels::Kernels& k_;
  Communicator* shards_ = nullptr;  // ZeRO-3's group; null: the parameters are whole here
  ZeroStage zero_;                  // as applied (ZeRO-3 without a group of two: gradients)
  std::vector<bool> windowed_;      // per unit
  kernels::DeviceBuffer params_, grads_;
  std::vector<size_t> unit_storage_;  // per layout unit: where its gradients (ZeRO-3: and parameters) start now
  size_t window_start_[2] = {0, 0};
  std::vector<int> tensor_unit_;      // per tensor: its unit
  std::vector<size_t> within_unit_;   // per tensor: where it starts in its unit
  // ZeRO-3: the units cut into pieces (where the data regions begin and end; unit u's
  // are pieces_[unit_pieces_[u] .. unit_pieces_[u + 1])), each sharded over its group;
  // this rank's block of every piece (held_), one after the other, the fp32 master values
  // the optimizer updates; per window the unit whose parameters are in it (-1: none) and
  // its gather.
  std::vector<FlatRange> pieces_;
  std::vector<Communicator*> piece_group_;
  std::vector<size_t> unit_pieces_;
  // ZeRO-3: the group holding (and sharding) the tensors of `piece` (one of pieces_, or
  // within one).
  Communicator* holders_of(const FlatRange& piece) const;
  GroupOf region_groups_;
  kernels::DeviceBuffer master_;
  std::vector<FlatRange> held_;
  std::vector<size_t> master_offset_;  // per piece: where its block starts in master_
  int window_unit_[2] = {-1, -1};
  RequestPtr window_gather_[2];
  kernels::DType act_type_;
  kernels::DeviceBuffer weights_;  // the compute copy, when it is not params_ itself
  Act* weights_act_;
  bool weights_stale_ = true;
};

}  // namespace trident
