// Tensor-parallel communication, as Megatron names it by region, so the layers read as
// math. Column-parallel layers (qkv, the MLP's input, the vocabulary-parallel head) take
// a replicated input and produce a shard; row-parallel layers (attention's and the
// MLP's output) take a shard and produce partial sums. Per transformer block: one
// all-reduce in the forward of each of attention and MLP (the row-parallel outputs) and
// one in the backward of each (the gradient of the column-parallel inputs). When tp
// exceeds the key/value heads, consecutive ranks share a head; their parts of its
// projections' gradients are summed once per step (sum_shared_head_gradients).
#pragma once

#include <cstddef>
#include <span>

#include "parallel/communicator.h"

namespace trident {

class TensorParallel {
 public:
  TensorParallel() = default;  // one rank: every function is the identity
  // shared_heads: the ranks of this rank's tp group that hold the same key/value head
  // (null: none share one).
  // sequence_parallel: Megatron's sequence parallelism (below).
  explicit TensorParallel(Communicator& tp, Communicator* shared_heads = nullptr, bool sequence_parallel = false)
      : tp_(tp.size() > 1 ? &tp : nullptr),
        shared_heads_(shared_heads != nullptr && shared_heads->size() > 1 ? shared_heads : nullptr),
        rank_(tp.rank()),
        size_(tp.size()),
        sequence_parallel_(sequence_parallel && tp.size() > 1) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Sequence parallelism: between the tensor-parallel regions (the norms, the residual
  // adds) each rank holds only its 1/tp of the B*T rows. Entering a column-parallel
  // layer the rows are all-gathered (instead of the input being replicated); leaving a
  // row-parallel one the partial sums are reduce-scattered to their rows' owners
  // (instead of all-reduced). In backward each becomes the other. The same bytes as the
  // all-reduces, and the norm regions' activations shrink by tp. The norms' gains and
  // biases then see only this rank's rows: their gradients are summed over tp.
  bool sequence_parallel() const { return sequence_parallel_; }
  // `rows` holds size() blocks of rows, this rank's block filled: fill the others.
  void gather_sequence(ActivationSpan rows) { tp_->all_gather(rows); }
  // this rank's block of the sum over ranks of `partial` (all rows) into `mine`.
  void scatter_sequence(ActivationSpan partial, ActivationSpan mine) { tp_->reduce_scatter(partial, mine); }
  RequestPtr sum_sequence_partial_gradients(std::span<float> grads) {
    return sequence_parallel_ ? tp_->all_reduce_async(grads, ReduceOp::sum) : nullptr;
  }

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

  // Starts summing the parts of a per-head weight's gradient over tp (each rank's heads').
  RequestPtr sum_head_partial_gradients(std::span<float> grads) {
    return tp_ != nullptr ? tp_->all_reduce_async(grads, ReduceOp::sum) : nullptr;
  }

  // Starts summing a shared key/value head's gradient part over the ranks that hold it
  // (null when no rank shares one).
  RequestPtr sum_shared_head_gradients(std::span<float> grads) {
    return shared_heads_ != nullptr ? shared_heads_->all_reduce_async(grads, ReduceOp::sum) : nullptr;
  }

  // Sums the parts of the experts' routing-weight gradients over tp (each rank's share of
  // the experts' hidden columns gave part of each dot product).
  void sum_routing_weight_gradients(float* dweights, size_t n) { all_reduce(dweights, n, ReduceOp::sum); }

  Communicator* communicator() const { return tp_; }

 private:
  void all_reduce(float* x, size_t n, ReduceOp op) {
    if (tp_ != nullptr) tp_->all_reduce(std::span<float>(x, n), op);
  }
  void all_reduce(ActivationSpan x) {
    if (tp_ != nullptr) tp_->all_reduce(x, ReduceOp::sum);
  }

  Communicator* tp_ = nullptr;
  Communicator* shared_heads_ = nullptr;
  int rank_ = 0, size_ = 1;
  bool sequence_parallel_ = false;
};

}  // namespace trident
