// A layer of the model (Megatron-Core's modules, torchtitan's nn.Modules): what it
// declares and how it runs. It declares its tensors (name, shape, initialiser and
// placement: model/placement.h) into its stage's parameter layout, and its activations
// (what it keeps per micro-batch, what recomputation may drop, backward's scratch) into
// its stage's arena; then it runs forward and backward on them, backward in two halves
// under zb1 (the input gradients now, the weight gradients later). The layers are
// embedding.h, norm.h, attention.h, mlp.h and head.h, built by the model's family
// (model/families/) into blocks (model/block.h); tensor parallelism is inside them
// (parallel_linear.h), data parallelism and ZeRO outside (parallel/).
//
// Each kind runs with the signature its place in the model needs (a norm's output is its
// own, a sublayer writes into the residual stream, the head ends in a loss); what they
// share is below. What the attention layers of a stage share that depends on the sequence
// only (rotary tables, the cp ring, the masks) is theirs: attention_context.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/activations.h"
#include "model/layers/sequence_regions.h"
#include "model/parameters.h"
#include "parallel/param_grad_store.h"

namespace trident {

class AttentionContext;
class Communicator;

// What the mixtures of experts' routers (moe.h) add up over a step, on the host.
struct RouterStats {
  // The auxiliary losses' total: the sum over sequences of their load-balancing losses,
  // plus the z-loss's per-token terms / seq_len. The routers add to it on the device
  // (aux_loss_on_device, a double that the model owns and reads once a step).
  double aux_loss_sum = 0;
  double* aux_loss_on_device = nullptr;
  // The tokens routed to each expert, [layer * n_experts + expert] over the whole model (a
  // stage fills its own layers').
  std::vector<double> tokens;
  // Token-expert pairs the routers chose, and those the experts computed (counted by tp
  // rank 0): equal when dropless.
  double rows_routed = 0, rows_computed = 0;

  void clear() {
    aux_loss_sum = 0;
    rows_routed = rows_computed = 0;
    std::fill(tokens.begin(), tokens.end(), 0.0);
  }
};

// The routers' choices, as verify compares them with a reference's: each first forward
// (not a recomputation) of a mixture appends its block's index and its rows' experts
// [rows, K], the rows in their order (the micro-batch's sequences, each its positions on
// this rank). A host copy each: for verify, not for training.
struct RoutingRecord {
  struct Forward {
    int layer = 0;
    std::vector<int32_t> experts;
  };
  std::vector<Forward> forwards;
};

// Memory whose size the data decides: a dropless mixture's rows received from other ranks
// beyond the headroom (model.moe_dropless_headroom balanced shares) that the arena (and the
// memory plan) holds. Each buffer is
// named by its owner (a layer; null: shared by the stage's layers), a slot and what it
// holds; grown when needed (what it held is not kept), kept for the next time. bytes():
// all of it, which the run reports beside its plan.
class GrowingScratch {
 public:
  void* at_least(const void* owner, int slot, int which, kernels::Kernels& k, size_t bytes) {
    kernels::DeviceBuffer& b = buffers_[{owner, slot, which}];
    const size_t floats = std::max<size_t>(1, (bytes + sizeof(float) - 1) / sizeof(float));
    if (b.size() < floats) {
      // Half as large again at least: a few sizes over a run, not one per routing (each
      // buffer let go may stay a hole in the host's heap).
      const size_t grown = std::max(floats, b.size() + b.size() / 2);
      bytes_ -= b.size() * sizeof(float);
      b = kernels::DeviceBuffer();  // freed first: the old and the new are never held at once
      b = kernels::DeviceBuffer(k, grown);
      bytes_ += grown * sizeof(float);
    }
    return b.data();
  }
  size_t bytes() const { return bytes_; }

 private:
  std::map<std::tuple<const void*, int, int>, kernels::DeviceBuffer> buffers_;
  size_t bytes_ = 0;
};

// What every layer of a stage runs with on this rank.
struct LayerRuntime {
  kernels::Kernels& k;
  ParamGradStore& store;      // the weights' compute copy and the gradients
  SequenceRegions& regions;   // the tensor-parallel group and sequence parallelism's regions
  const ActivationArena& arena;
  int T = 0;                            // this rank's tokens of a sequence
  const int32_t* positions = nullptr;   // their positions in the sequence, device (learned positions' rows)
  double* loss_sum = nullptr;           // the head's total of token losses, on the device
  Communicator* context = nullptr;      // context parallelism's group (null: each sequence whole here)
  RouterStats* router = nullptr;        // the MoE routers' step totals (null: not counted)
  Communicator* experts = nullptr;      // expert parallelism's group (null: every expert here)
  GrowingScratch* growing = nullptr;
  RoutingRecord* routing = nullptr;  // verify's record of the routers' choices (null: none)
  float* buffers = nullptr;  // the stage's declared buffers (StateKind::buffer), fp32, at their offsets

  TensorParallel& tp() const { return regions.tp(); }
  const kernels::Act* weight(int index) const { return store.weight(index); }
  float* grad(int index) const { return store.grad(index); }
  template <class T = kernels::Act>
  T* kept(int slot, int handle) const {
    return arena.kept<T>(slot, handle);
  }
};

// One micro-batch's pass through a layer.
struct Pass {
  int slot = 0;  // its activation slot
  int B = 0;     // its sequences
  // zb1's input-gradient half: the weight gradients' inputs are left in the slot for the
  // weight half (Layer::weight_gradients) instead of being used now.
  bool defer = false;
  // Backward: d loss / d (each token's loss) (1 / (global batch x seq_len), the mean's).
  float loss_scale = 0;
};

// What a step counted over the whole job, once its figures are summed over the data-parallel
// ranks and the stages (the step runner's one reduction): what a layer updates its buffers
// from (model/parameters.h's StateKind::buffer), after the optimizer's step.
struct StepFigures {
  // The tokens each expert was chosen for, [model layer][expert] (empty rows: dense layers).
  const std::vector<std::vector<double>>* expert_tokens = nullptr;
};

class Layer {
 public:
  virtual ~Layer() = default;
  // Adds its tensors to the stage's layout (in the order the flat buffer holds them) and
  // keeps their indices; its buffers too (StateKind::buffer).
  virtual void declare_parameters(ParameterDeclarations& parameters) = 0;
  // Declares its activations (after its parameters: the widths it holds are known then).
  virtual void declare_activations(ActivationDeclarations& activations) = 0;
  // After each step's update: its buffers moved by the step's figures, alike on every
  // rank holding them (none: nothing to do).
  virtual void update_buffers(LayerRuntime& /*r*/, const StepFigures& /*figures*/) {}
};

// What a block's residual branch runs after its norm (attention, the MLP): it reads the
// norm's output and writes its own into the residual stream (the block adds the skip).
class Sublayer : public Layer {
 public:
  using Act = kernels::Act;
  // out (this rank's rows) = the sublayer of `in` (this rank's rows). output_needed
  // false: stop before the output projection (full recomputation reruns a block's
  // forward up to its last one: the block's output is kept).
  virtual void forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed = true) = 0;
  // From dout (this rank's rows of d loss / d out): returns where this rank's rows of
  // d loss / d in are; the weight gradients unless p.defer (then kept for
  // weight_gradients(), in buffers forward wrote: out among them).
  virtual const Act* backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) = 0;
  virtual void weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) = 0;
  // Selective recomputation: rebuilds what it dropped, before its backward.
  virtual void recompute_selective(LayerRuntime& /*r*/, const Pass& /*p*/) {}
  // Takes what it shares with the stage's other attention layers from their context, when
  // the stage is built, after its declarations (attention.h); other sublayers take nothing.
  virtual void attach(AttentionContext& /*context*/) {}
};

}  // namespace trident
