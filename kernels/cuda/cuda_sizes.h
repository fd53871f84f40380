// The sizes the CUDA kernels allocate for themselves, in plain C++ so that the memory
// plan can count them without a GPU (kernels/footprint.h). The .cu files take their
// constants from here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace trident::kernels::cuda_sizes {

constexpr size_t kGemmWorkspaceBytes = 32u << 20;  // what cuBLASLt's fastest Hopper kernels ask for
constexpr int kNormBackwardBlocks = 2048;          // one warp each; slots of the weight-gradient partial sums
constexpr int kColumnSumRowChunks = 32;            // column sums: row ranges summed by separate blocks
constexpr int kSumSquaresPartials = 1024;          // blocks of the first reduction stage

inline int norm_backward_blocks(int N) { return N < kNormBackwardBlocks ? N : kNormBackwardBlocks; }
inline size_t layernorm_backward_scratch_floats(int N, int C) { return static_cast<size_t>(norm_backward_blocks(N)) * 2 * C; }
inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return static_cast<size_t>(norm_backward_blocks(N)) * C; }
inline size_t column_sums_scratch_floats(int OC) { return static_cast<size_t>(kColumnSumRowChunks) * OC; }

// The experts a rank holds, at most, for which the grouped GEMMs' pointer arrays are sized
// up front (more grow them at their first use).
constexpr size_t kMaxGroupedProblems = 1024;

// The backend's own largest upload(): embedding_backward's token index (3N + 2 ints) or a
// grouped GEMM's pointer arrays (A, B and C of each expert). The model's own uploads come
// on top of it (Kernels::reserve_uploads()).
inline size_t own_upload_bytes(int N) {
  return std::max((3 * static_cast<size_t>(N) + 2) * sizeof(int32_t), 3 * kMaxGroupedProblems * sizeof(void*));
}

// Flash attention keeps each row's log-sum-exp.
inline size_t attention_stats_floats(int B, int T, int NH) { return static_cast<size_t>(B) * NH * T; }

// The backend's scratch grows to the largest of its users (norm backward partials, column
// sums, attention backward's row deltas); the token index and norm scratch are their own.
inline size_t workspace_bytes(int N, int C, int max_width, int B, int T, int NH) {
  const size_t scratch = std::max({layernorm_backward_scratch_floats(N, C), rmsnorm_backward_scratch_floats(N, C),
                                   column_sums_scratch_floats(max_width), static_cast<size_t>(B) * NH * T}) *
                         sizeof(float);
  return kGemmWorkspaceBytes + scratch + (3 * static_cast<size_t>(N) + 2) * sizeof(int32_t) +
         (kSumSquaresPartials + 1) * sizeof(double);
}

}  // namespace trident::kernels::cuda_sizes
