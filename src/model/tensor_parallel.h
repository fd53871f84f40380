// Tensor-parallel communication, as Megatron names it by region, so the layers read as
// math. Column-parallel layers (qkv, the MLP's input, the vocabulary-parallel head) take
// a replicated input and produce a shard; row-parallel layers (attention's and the
// MLP's output) take a shard and produce partial sums. Per transformer block: one
// all-reduce in the forward of each of attention and MLP (the row-parallel outputs) and
// one in the backward of each (the gradient of the column-parallel inputs). The sums of
// weight gradients over tp's ranks (a shared key/value head's, a norm's under sequence
// parallelism) follow each tensor's placement (model/placement.h), once per step.
#pragma once

#include <cstddef>
#include <span>

#include "parallel/communicator.h"

namespace trident {

class TensorParallel {
 public:
  TensorParallel() = default;  // one rank: every function is the identity
  // sequence_parallel: Megatron's sequence parallelism (below).
  explicit TensorParallel(Communicator& tp, bool sequence_parallel = false)
      : tp_(tp.size() > 1 ? &tp : nullptr),
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
  // biases then see only this rank's rows: their gradients are summed over tp (their
  // placement's sp axis).
  bool sequence_parallel() const { return sequence_parallel_; }
  // `rows` holds size() blocks of rows, this rank's block filled: fill the others.
  void gather_sequence(ActivationSpan rows) { tp_->all_gather(rows); }
  // this rank's block of the sum over ranks of `partial` (all rows) into `mine`.
  void scatter_sequence(ActivationSpan partial, ActivationSpan mine) { tp_->reduce_scatter(partial, mine); }

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
  int rank_ = 0, size_ = 1;
  bool sequence_parallel_ = false;
};

}  // namespace trident
