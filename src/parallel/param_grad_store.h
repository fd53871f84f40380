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
//   backward (unless still there), the next block's gather issued ahead; the embeddings
//   and head are gathered after each update and stay, as FSDP2 keeps its root module
//   unsharded. In bf16 what is gathered is the compute copy (half the bytes, as FSDP's
//   bf16 param_dtype): no fp32 parameters are stored besides the masters.
#pragma once

#include <cstddef>
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
  // expert_shard_group: under expert parallelism the ranks holding the same experts, which
  // shard the experts' tensors (the layout's expert_ranges) instead.
  ParamGradStore(const ParameterLayout& layout, kernels::Kernels& k, ZeroStage zero, Communicator* shard_group,
                 Communicator* expert_shard_group = nullptr);
  ParamGradStore(const ParamGradStore&) = delete;
  ParamGradStore& operator=(const ParamGradStore&) = delete;

  // What the storage of `layout` takes under `zero`, for memory plans: the gradients
  // (windowed from ZeRO-2), the fp32 parameters (ZeRO-3: stored as the gradients; none
  // in bf16), and the elements of the compute copy (ZeRO-3: stored as the gradients).
  static size_t gradient_floats_for(const ParameterLayout& layout, ZeroStage zero);
  static size_t parameter_floats_for(const ParameterLayout& layout, ZeroStage zero, kernels::Precision precision);
  static size_t compute_weight_floats_for(const ParameterLayout& layout, ZeroStage zero);

  bool parameters_sharded() const { return shards_ != nullptr; }

  // ---- what the layers read and write ----
  // The compute copy of tensor `index`; null for -1 (a tensor the family lacks). Under
  // ZeRO-3 a block's tensors are there between use_block() and the next block's.
  const Act* weight(int index) const {
    return index < 0 ? nullptr : kernels::offset(weights_act_, param_offset_[index], act_type_);
  }
  // Where backward adds the gradient of tensor `index` (null for -1).
  float* grad(int index) const { return index < 0 ? nullptr : grads_.data() + grad_offset_[index]; }
  // Before a forward pass: the compute copy brought up to date with the parameters
  // (ZeRO-3: the kept units gathered).
  void refresh_weights();
  // ZeRO-3 (nothing otherwise): makes local block l's weights ready and starts gathering
  // block `next` ahead (if it is one of the stage's): the other window's block is done
  // with (forward: the one before; backward: the one after).
  void use_block(int l, int next);
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
  // under expert parallelism of each piece of a unit: its experts' tensors and the rest).
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
  // windows (gradient_location() maps a flat offset into it).
  float* grads() const { return grads_.data(); }
  // Where the gradient of flat offset `offset` lives (a block's: in its window).
  float* gradient_location(size_t offset) const;
  void zero_grad();

  // The bytes of the compute copy when it is not the parameters themselves (memory report).
  size_t compute_weight_bytes() const { return weights_.size() * sizeof(float); }

 private:
  // Unit u's parameters (in bf16 its compute copy) from every rank's piece into their
  // storage; returns the gather in flight.
  RequestPtr gather_unit(size_t u);
  // Starts gathering local block l's parameters into its window (unless there).
  void gather_block(int l);

  const ParameterLayout& layout_;
  kernels::Kernels& k_;
  Communicator* shards_ = nullptr;  // ZeRO-3's group; null: the parameters are whole here
  ZeroStage zero_;                  // as applied (ZeRO-3 without a group of two: gradients)
  kernels::DeviceBuffer params_, grads_;
  std::vector<size_t> unit_storage_;  // per layout unit: where its gradients (ZeRO-3: and parameters) start
  std::vector<size_t> grad_offset_;   // per tensor: where its gradient starts in grads_
  std::vector<size_t> param_offset_;  // per tensor: where it starts in params_ (and the compute copy)
  // ZeRO-3: the units cut into pieces (where the experts' tensors begin and end; unit u's
  // are pieces_[unit_pieces_[u] .. unit_pieces_[u + 1])), each sharded over its group;
  // this rank's block of every piece (held_), one after the other, the fp32 master values
  // the optimizer updates; per window the block in it (-1: none) and its gather.
  std::vector<FlatRange> pieces_;
  std::vector<Communicator*> piece_group_;
  std::vector<size_t> unit_pieces_;
  Communicator* expert_shards_ = nullptr;
  kernels::DeviceBuffer master_;
  std::vector<FlatRange> held_;
  std::vector<size_t> master_offset_;  // per piece: where its block starts in master_
  int window_block_[2] = {-1, -1};
  RequestPtr window_gather_[2];
  kernels::DType act_type_;
  kernels::DeviceBuffer weights_;  // the compute copy, when it is not params_ itself
  Act* weights_act_;
  bool weights_stale_ = true;
};

}  // namespace trident
