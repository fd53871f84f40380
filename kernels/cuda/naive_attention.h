// The naive three-kernel causal attention (scores, softmax, weighted sum; backward:
// dP, softmax backward, dQ/dK/dV), with the T x T matrices in memory: the baseline that
// benchmarks/gpu/kernel_check compares the flash-attention kernels against. Plain C++.
// Grouped-query attention as kernels/kernels.h has it (qkv rows [q NH | k NKV | v NKV] x
// HD; query head h reads key/value head h / (NH / NKV)).
#pragma once

#include "kernels/dtype.h"

namespace trident::kernels::cuda {

// probs: B*NH*T*T floats.
void naive_attention_forward(DType type, Act* out, float* probs, const Act* qkv, int B, int T, int NH, int NKV, int HD);
// dprobs: B*NH*T*T floats of scratch.
void naive_attention_backward(DType type, Act* dqkv, float* dprobs, const Act* dout, const Act* qkv,
                              const float* probs, int B, int T, int NH, int NKV, int HD);

}  // namespace trident::kernels::cuda
