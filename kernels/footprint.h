// What a kernel backend takes and keeps, apart from running kernels: how it stores
// activations, what attention keeps for backward, its own workspace. The memory plan
// (src/plan/memory_plan.h) reads only this, so a plan for GPUs can be made on a machine
// without one (`trident plan`): cuda_footprint() answers for the CUDA backend from the
// same sizes its kernels use (kernels/cuda/cuda_sizes.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/dtype.h"

namespace trident::kernels {

// The largest operands of a stage's GEMMs, in elements: A (the input, or the output's
// gradient) and B (the weight, or the input of a weight gradient).
struct GemmOperands {
  size_t a = 0, b = 0;
};

const char* precision_name(Precision p);
Precision parse_precision(const std::string& name);  // "fp32" or "bf16"; UsageError otherwise

class Footprint {
 public:
  virtual ~Footprint() = default;
  virtual Precision precision() const = 0;
  // How Act elements are stored (what communication of activations sends).
  virtual DType activation_type() const = 0;
  size_t activation_bytes(size_t elements) const { return elements * dtype_bytes(activation_type()); }
  // True where this memory is the host's (the CPU backend): readers may then fill it in place.
  virtual bool host_memory() const { return false; }
  // What attention keeps for backward besides qkv and its output, in floats: both
  // backends, flash-attention style, keep each row's log-sum-exp [B,NH,T] and recompute
  // the probabilities from it.
  virtual size_t attention_stats_floats(int B, int T, int NH) const = 0;
  // The most memory the kernels take for themselves besides the buffers they are given
  // (GEMM workspace, backward scratch), for rows N of width C, outputs up to max_width
  // wide and attention over B sequences of T tokens with NH heads.
  virtual size_t workspace_bytes(int N, int C, int max_width, int B, int T, int NH) const = 0;
  // What a backend that copies its GEMMs' inputs keeps for the copies (the CPU's bf16
  // GEMMs: kernels/cpu/bf16_gemm.h); 0 for the others.
  virtual size_t gemm_copy_bytes(const GemmOperands& /*largest*/) const { return 0; }
};

// The CUDA backend's footprint, without a GPU (and in builds without CUDA).
std::unique_ptr<Footprint> cuda_footprint(Precision precision);

}  // namespace trident::kernels
