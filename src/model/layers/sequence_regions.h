// Sequence parallelism's regions (Megatron's), as the tensor-parallel layers use them, so
// that each reads as math: between the tensor-parallel regions (the norms, the residual
// adds) each rank holds only its 1/tp of the B*T rows; entering a column-parallel layer
// the rows are all-gathered, leaving a row-parallel one the partial sums are
// reduce-scattered to their rows' owners (model/tensor_parallel.h). Without sequence
// parallelism every function is the identity or the plain all-reduce.
#pragma once

#include "kernels/kernels.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"

namespace trident {

class SequenceRegions {
 public:
  using Act = kernels::Act;

  // T: this rank's tokens of a sequence; C: the residual stream's width. gathered
  // ([B*T, C], all rows) and reduced ([B*T/tp, C], this rank's) are backward's scratch,
  // set once the arena is allocated.
  SequenceRegions(TensorParallel& tp, kernels::Kernels& k, int T, int C)
      : tp_(tp), k_(k), T_(T), C_(C), type_(k.activation_type()) {}

  // The rows of the residual stream this rank holds: all B*T, or 1/tp of them under
  // sequence parallelism (this rank's block).
  int rows(int B) const { return B * T_ / (tp_.sequence_parallel() ? tp_.size() : 1); }
  ActivationSpan rows_of(Act* x, int B) const { return {x, static_cast<size_t>(rows(B)) * C_, type_}; }
  ActivationSpan all_rows(Act* x, int B) const { return {x, static_cast<size_t>(B) * T_ * C_, type_}; }

  // All rows of `mine` (in the shared gathered buffer).
  const Act* gathered_rows(const Act* mine, int B);
  // Where a row-parallel GEMM writes its partial sums.
  Act* row_parallel_output(Act* mine) const { return tp_.sequence_parallel() ? gathered : mine; }
  // Their sum into this rank's rows.
  void reduce_rows(Act* partial, Act* mine, int B);
  // The same for a gradient of all rows (a column-parallel layer's input's): returns
  // where this rank's rows of the sum are.
  const Act* reduce_gradient_rows(Act* partial, int B);

  TensorParallel& tp() const { return tp_; }
  Act* gathered = nullptr;
  Act* reduced = nullptr;

 private:
  TensorParallel& tp_;
  kernels::Kernels& k_;
  int T_, C_;
  kernels::DType type_;
};

}  // namespace trident
