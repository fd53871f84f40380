// An optimizer over a model's flat parameter buffer (model/parameters.h). It updates the
// parameters of the ranges this rank owns (all of them, or its ZeRO shard) and keeps its
// state for those alone, in the backend's memory: buffers of one float per parameter it
// updates, each with a name (its kind in checkpoints: AdamW's exp_avg and exp_avg_sq).
// Whoever needs to know about the optimizer asks through OptimizerKind, never a concrete
// class: the training step, the checkpoint (its state by name), the memory plan, `trident
// plan` (the bytes an update moves) and doctor (a checkpoint's size).
//
// A new optimizer is one file (optim/NAME.cpp: its update and its registration) and its
// kernel (kernels/ops.def). Weight decay follows each tensor's placement. A state buffer
// may hold some tensors only (OptimizerKind::holds: Muon's momentum for the hidden
// matrices, AdamW's moments for the rest), and an optimizer that needs a tensor whole
// (Muon) overrides step() and gathers its pieces over the OptimizerMesh.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/parameters.h"
#include "runtime/flat_range.h"

namespace trident {

class Communicator;
class Optimizer;

// The train config's settings of an optimizer (each takes what it uses).
struct OptimizerSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

// The ranks that hold the pieces of this rank's tensors, for an optimizer that updates a
// tensor whole (Muon): ZeRO's shard group, which cuts the flat buffer into each rank's
// owned ranges, and the tp group, which cuts a tensor into pieces (its placement). Without
// ZeRO, `shards` may be the data-parallel ranks, all owning alike ranges (they share the
// work); null where no other rank takes part (one dp rank; tp 1).
struct OptimizerMesh {
  Communicator* shards = nullptr;
  std::vector<std::vector<FlatRange>> owned_by;  // per rank of `shards`: its owned ranges
  Communicator* tp = nullptr;
};

// What an optimizer is, before one is built.
struct OptimizerKind {
  std::string name;                      // train.optimizer
  std::vector<std::string> state_names;  // its state buffers, in the checkpoint's order
  // Bytes one update moves per parameter on a GPU (read the parameter, its gradient and
  // state; write the parameter, its state and the bf16 compute copy): `plan`'s update time.
  double update_bytes_per_parameter = 0;
  std::function<std::unique_ptr<Optimizer>(const OptimizerKind&, const ParameterLayout&, const OptimizerSettings&,
                                           kernels::Kernels&, const std::vector<FlatRange>& owned,
                                           const OptimizerMesh&)>
      make;  // make_as<ItsClass>
  // Whether state buffer `state` has a place for tensor `t` of `layout`; null: every
  // buffer for every tensor. A checkpoint holds zeros where a buffer has none.
  std::function<bool(size_t state, const ParameterLayout& layout, const ParameterTensor& t)> holds;
  // The floats it keeps beside its state for these owned ranges, at the most (null: none):
  // Muon's updates of the matrices and, during a step, the pieces it gathers. The memory plan's.
  std::function<size_t(const ParameterLayout& layout, const std::vector<FlatRange>& owned)> work_floats_for;
  // The tensors it updates whole, each gathered on one owner rank and its update scattered
  // back (Muon's hidden matrices, as their placement declares them); null: it updates every
  // parameter where it lies (elementwise: AdamW, Lion).
  std::function<bool(const Placement& placement)> whole_tensor;
  bool updates_whole(const Placement& p) const { return whole_tensor && whole_tensor(p); }

  // The floats of its state for these owned ranges of `layout` (empty: all of it).
  size_t state_floats_for(const ParameterLayout& layout, const std::vector<FlatRange>& owned) const;
  bool holds_tensor(size_t state, const ParameterLayout& layout, const ParameterTensor& t) const {
    return !holds || holds(state, layout, t);
  }
};

// Registers an optimizer under its name (at static initialization: the registering file's
// `const bool registered = register_optimizer(...)`); returns true.
bool register_optimizer(OptimizerKind kind);
// The registered optimizer `name`; UsageError naming train.optimizer and the choices.
const OptimizerKind& optimizer_kind(const std::string& name);
// An optimizer of the registered kind `name` for the owned ranges (empty: all of them);
// `mesh`: where the other pieces of its tensors are (Muon's whole matrices).
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const ParameterLayout& layout,
                                          const OptimizerSettings& settings, kernels::Kernels& k,
                                          const std::vector<FlatRange>& owned = {}, const OptimizerMesh& mesh = {});

class Optimizer {
 public:
  // Where the value (or the gradient) of flat offset `offset` lives: the flat buffer, or
  // a shard (ZeRO); each tensor's piece of an owned range is contiguous there.
  using ParameterAt = std::function<float*(size_t offset)>;
  using GradientAt = std::function<const float*(size_t offset)>;

  // Its state for the owned ranges of `layout` (empty: all of them), in k's memory.
  Optimizer(const OptimizerKind& kind, const ParameterLayout& layout, const OptimizerSettings& settings,
            kernels::Kernels& k, const std::vector<FlatRange>& owned, const OptimizerMesh& mesh = {});
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const OptimizerKind& kind() const { return kind_; }
  // One update with learning rate lr on gradients multiplied by grad_scale (the clip
  // coefficient). Advances the step count first (bias corrections count from 1).
  // Collective over the mesh for an optimizer that updates tensors whole.
  virtual void step(const ParameterAt& parameter_at, const GradientAt& gradient_at, double lr, double grad_scale);
  // The same over one flat buffer of parameters and one of gradients.
  void step(float* params, const float* grads, double lr, double grad_scale);
  int steps_taken() const { return t_; }
  void set_steps_taken(int t) { t_ = t; }

  // State buffer `i` (kind().state_names[i]) as a buffer of the whole flat layout (n
  // floats, zero outside the owned ranges) in host memory, and back (only the owned
  // ranges are read): for checkpoints.
  void state_to_host(size_t i, float* full, size_t n) const;
  void state_from_host(size_t i, const float* full);
  size_t state_floats() const;

 protected:
  // A piece of one tensor inside an owned range: where it is, where each state buffer
  // holds it (kNoState where that buffer has no place for the tensor).
  static constexpr size_t kNoState = ~size_t{0};
  struct Segment {
    size_t offset, size;
    std::vector<size_t> state_offset;  // per state buffer
    bool decay;
    int tensor;  // its index in the layout
  };
  // Updates n parameters of one tensor (step t from 1): param, grad and each state
  // buffer's piece (state[i] for state buffer i, null where it holds none of the tensor);
  // weight_decay: the settings' where the tensor's placement asks for decay, else 0.
  virtual void update(float* param, const float* grad, float* const* state, size_t n, double lr, double weight_decay,
                      int t, double grad_scale) = 0;
  // The pieces of the tensors this rank updates, in the order of its owned ranges.
  const std::vector<Segment>& segments() const { return segments_; }
  // Where state buffer i holds segment s; null where it has no place for its tensor.
  float* state_of(size_t i, const Segment& s);
  int advance_step() { return ++t_; }
  const OptimizerSettings settings_;
  kernels::Kernels& k_;
  const ParameterLayout& layout_;
  const OptimizerMesh mesh_;

 private:
  static std::vector<Segment> segments_of(const OptimizerKind& kind, const ParameterLayout& layout,
                                          const std::vector<FlatRange>& owned);
  friend struct OptimizerKind;

  const OptimizerKind& kind_;
  std::vector<Segment> segments_;
  std::vector<kernels::DeviceBuffer> state_;
  int t_ = 0;
};

// OptimizerKind::make of an optimizer class (its constructor: Optimizer's).
template <class O>
std::unique_ptr<Optimizer> make_as(const OptimizerKind& kind, const ParameterLayout& layout,
                                   const OptimizerSettings& settings, kernels::Kernels& k,
                                   const std::vector<FlatRange>& owned, const OptimizerMesh& mesh) {
  return std::make_unique<O>(kind, layout, settings, k, owned, mesh);
}

}  // namespace trident
