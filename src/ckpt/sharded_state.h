// What a checkpoint saves and restores of one rank's training state, by name: the
// parameters' sharded tensors, the optimizer's state buffers, its step count. The Checkpointer
// sees these views only, not the model, the optimizer or data parallelism
// (TrainingSetup::sharded_state builds them).
//
// Each is a flat buffer of the parameter layout of which this rank may hold only some
// ranges: with ZeRO its block of every bucket (the optimizer's state; from ZeRO-3 the parameters
// too), the other blocks held by the other ranks of the shard group (dp, or hybrid
// sharding's group).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/parameters.h"

namespace trident {

// One named buffer of the optimizer's state, seen through host memory.
struct ShardedBuffer {
  std::string name;  // the checkpoint's kind: AdamW's exp_avg, exp_avg_sq (optim/optimizer.h)
  // Into `flat` (the layout's total_floats()): this rank's ranges, zeros elsewhere.
  std::function<void(float* flat)> to_host;
  // Out of a full flat buffer: this rank's ranges are read.
  std::function<void(const float* flat)> from_host;
};

struct ShardedState {
  ShardedParameters parameters;  // the checkpoint's kind params
  std::string optimizer;         // its name (train.optimizer), recorded in the manifest
  std::vector<ShardedBuffer> optimizer_state;  // in the order the node files hold them
  // Completes a flat host buffer holding this rank's ranges with the other ranks' of
  // the shard group (collective over it; nothing to do without ZeRO).
  std::function<void(float* flat)> gather_shards;
  // The optimizer's step count (its bias correction), set when loading.
  std::function<void(int steps)> set_optimizer_steps;
  // The model's declared buffers (the layout's buffers(), StateKind::buffer): a flat host
  // buffer of buffer_floats(), whole on every rank (kind kBuffers in the node files).
  ShardedBuffer buffers;

  // The rank's whole state as one flat host buffer, as it holds it (nothing gathered): the
  // parameters, each optimizer state buffer (the layout's total floats each), the buffers.
  // The memory tier's snapshot (ckpt/memory_tier.h).
  size_t packed_floats() const {
    return (1 + optimizer_state.size()) * parameters.layout->total_floats() + parameters.layout->buffer_floats();
  }
  void pack(float* flat) const {
    const size_t n = parameters.layout->total_floats();
    parameters.to_host(flat);
    for (size_t i = 0; i < optimizer_state.size(); i++) optimizer_state[i].to_host(flat + (1 + i) * n);
    if (parameters.layout->buffer_floats() > 0) buffers.to_host(flat + (1 + optimizer_state.size()) * n);
  }
  // Out of pack()'s buffer, the state after `step` steps.
  void unpack(const float* flat, int step) const {
    const size_t n = parameters.layout->total_floats();
    parameters.from_host(flat);
    if (parameters.changed) parameters.changed();
    for (size_t i = 0; i < optimizer_state.size(); i++) optimizer_state[i].from_host(flat + (1 + i) * n);
    if (parameters.layout->buffer_floats() > 0) buffers.from_host(flat + (1 + optimizer_state.size()) * n);
    set_optimizer_steps(step);
  }
};

}  // namespace trident
