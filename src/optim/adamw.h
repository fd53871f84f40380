// AdamW over a model's flat parameter buffer, as PyTorch does it (FORMAT.md): decoupled
// weight decay on tensors of 2 or more dimensions only, bias-corrected moments. It
// updates the parameters of `owned` ranges only (all of them, or a ZeRO shard), and
// keeps moments for those alone, in the backend's memory.
#pragma once

#include <functional>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/parameters.h"
#include "runtime/flat_range.h"

namespace trident {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  // owned: ranges of the flat buffer this rank updates; empty: the whole buffer.
  AdamW(const ParameterLayout& layout, const AdamWSettings& settings, kernels::Kernels& k,
        const std::vector<FlatRange>& owned = {});

  // One update with learning rate lr on gradients multiplied by grad_scale (the clip
  // coefficient). Advances the step count t first (bias correction counts from 1).
  void step(float* params, const float* grads, double lr, double grad_scale);
  // The same with the gradients wherever they are (ZeRO-2: in a shard): gradient_at(offset)
  // is where the gradient of flat offset `offset` lives; each tensor's piece of an owned
  // range is contiguous there.
  void step(float* params, const std::function<const float*(size_t)>& gradient_at, double lr, double grad_scale);
  // The same with the parameters wherever they are too (ZeRO-3: this rank's shard).
  void step(const std::function<float*(size_t)>& parameter_at, const std::function<const float*(size_t)>& gradient_at,
            double lr, double grad_scale);

  int steps_taken() const { return t_; }
  void set_steps_taken(int t) { t_ = t; }
  // The two moments, by PyTorch's names for them (the checkpoints' too).
  enum class Moment { exp_avg, exp_avg_sq };
  // A moment as a buffer of the whole flat layout (n floats, zero outside the owned
  // ranges) in host memory, and back (only the owned ranges are read): for checkpoints.
  void moment_to_host(Moment which, float* full, size_t n) const;
  void moment_from_host(Moment which, const float* full);
  size_t state_floats() const { return m_.size() + v_.size(); }
  // What state_floats() will be for these owned ranges (for memory plans).
  static size_t state_floats_for(const ParameterLayout& layout, const std::vector<FlatRange>& owned);

 private:
  // A piece of one tensor inside an owned range: where it is, where its moments are.
  struct Segment {
    size_t offset, state_offset, size;
    bool decay;
  };
  static std::vector<Segment> segments_of(const ParameterLayout& layout, const std::vector<FlatRange>& owned);

  AdamWSettings settings_;
  kernels::Kernels& k_;
  std::vector<Segment> segments_;
  kernels::DeviceBuffer m_, v_;
  int t_ = 0;
};

// Clip coefficient min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double clip_coefficient(double norm, double grad_clip);

struct GradientNorm {
  double norm = 0.0;
  double clip_coefficient = 1.0;
  bool skipped = false;  // non-finite loss or norm: no update was applied
};
// Global L2 norm of all n gradients of one rank, and the clip coefficient.
GradientNorm clip_gradients(kernels::Kernels& k, const float* grads, size_t n, double grad_clip);

}  // namespace trident
