// Tensor-parallel communication, as Megatron names it by region, so the layers read as
// math. Column-parallel layers (c_attn, c_fc, the vocabulary-parallel head) take a
// replicated input and produce a shard; row-parallel layers (c_proj) take a shard and
// produce partial sums. Per transformer block: one all-reduce in the forward of each of
// attention and MLP (the row-parallel outputs) and one in the backward of each (the
// gradient of the column-parallel inputs).
#pragma once

#include <cstddef>
#include <span>

#include "parallel/communicator.h"

namespace trident {

class TensorParallel {
 public:
  TensorParallel() = default;  // one rank: every function is the identity
  explicit TensorParallel(Communicator& tp) : tp_(tp.size() > 1 ? &tp : nullptr), rank_(tp.rank()), size_(tp.size()) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Forward of a row-parallel layer: sum the partial outputs of all ranks.
  void reduce_from_region(ActivationSpan x) { all_reduce(x); }
  // Backward of a column-parallel layer's input (its forward copied the replicated
  // input into the region): each rank's d(input) covers its shard of the weight; sum them.
  void reduce_gradient_into_region(ActivationSpan dx) { all_reduce(dx); }
  // Vocabulary-parallel softmax: combine per-shard row maxima, and per-shard sums.
  void max_over_vocab_shards(float* x, size_t n) { all_reduce(x, n, ReduceOp::max); }
  void sum_over_vocab_shards(float* x, size_t n) { all_reduce(x, n, ReduceOp::sum); }
  // Vocabulary-parallel embedding: each row comes from the one shard that owns its token.
  void sum_embedding_shards(ActivationSpan x) { all_reduce(x); }

  Communicator* communicator() const { return tp_; }

 private:
  void all_reduce(float* x, size_t n, ReduceOp op) {
    if (tp_ != nullptr) tp_->all_reduce(std::span<float>(x, n), op);
  }
  void all_reduce(ActivationSpan x) {
    if (tp_ != nullptr) tp_->all_reduce(x, ReduceOp::sum);
  }

  Communicator* tp_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace trident
