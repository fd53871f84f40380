// The tensor-parallel linear layers (Megatron's ColumnParallelLinear and RowParallelLinear),
// the pieces attention and the MLP are made of. A column-parallel layer splits its
// weight's output rows over tp: it takes the replicated input (all rows, gathered under
// sequence parallelism) and produces this rank's columns of the output, with no
// communication in forward; in backward the input's gradient is summed over tp. A
// row-parallel layer splits its weight's input columns: it takes this rank's columns and
// produces partial sums, all-reduced (reduce-scattered under sequence parallelism) into
// the residual stream; its bias is added once, by tp rank 0, before the sum.
// y = x W^T (+ b), weights [out, in] as PyTorch's nn.Linear stores them.
#pragma once

#include <string>
#include <vector>

#include "model/layers/layer.h"

namespace trident {

class ColumnParallelLinear {
 public:
  // One tensor of the weight, [rows, in]: several are read side by side by one GEMM
  // (q | k | v, gate | up), each cut into `pieces` over tp (fewer than tp: shared).
  struct Part {
    std::string name;  // + ".weight"
    int64_t rows;
    int pieces;
    Sharding sharding = Sharding::rows;
  };
  // bias: a "<name>.bias" of each part's rows, cut as its part, side by side as the
  // output's columns (Qwen2's q, k and v biases).
  ColumnParallelLinear(std::vector<Part> parts, int in, bool bias) : parts_(std::move(parts)), in_(in), bias_(bias) {}

  void declare_parameters(ParameterDeclarations& d);
  int out_local() const { return out_local_; }  // this rank's output columns

  // out [B*T, out_local] = all rows of `in_rows` (this rank's rows of the input) x W^T (+ b).
  void forward(LayerRuntime& r, int B, const kernels::Act* in_rows, kernels::Act* out) const;
  // dinput [B*T, in] = dout W (its sum over tp: returns where this rank's rows of it are);
  // and unless p.defer, dW += dout^T x, db += sum of dout.
  const kernels::Act* backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout, const kernels::Act* in_rows,
                               kernels::Act* dinput) const;
  // The deferred dW and db, from the output's gradient the input half kept.
  void weight_gradients(LayerRuntime& r, int B, const kernels::Act* dout, const kernels::Act* in_rows) const;

 private:
  std::vector<Part> parts_;
  int in_;
  bool bias_;
  int weight_ = -1, bias_index_ = -1, out_local_ = 0;  // the first part's weight and bias
};

class RowParallelLinear {
 public:
  // The weight "<name>.weight" [out, in] (columns over tp), initialized for a residual
  // projection; bias "<name>.bias" [out], replicated.
  RowParallelLinear(std::string name, int out, int in, bool bias)
      : name_(std::move(name)), out_(out), in_(in), bias_(bias) {}

  void declare_parameters(ParameterDeclarations& d);
  int in_local() const { return in_local_; }  // this rank's input columns

  // out_rows (this rank's rows) = the sum over tp of in [B*T, in_local] x W^T, + b.
  void forward(LayerRuntime& r, int B, const kernels::Act* in, kernels::Act* out_rows) const;
  // dinput [B*T, in_local] = dout W (dout_rows: this rank's rows, gathered here); unless
  // p.defer, dW and db too, else dout_rows is kept in out_rows (the forward's output
  // buffer, no longer needed) for weight_gradients().
  void backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout_rows, const kernels::Act* in,
                kernels::Act* dinput, kernels::Act* out_rows) const;
  void weight_gradients(LayerRuntime& r, int B, const kernels::Act* in, kernels::Act* out_rows) const;

 private:
  std::string name_;
  int out_, in_;
  bool bias_;
  int weight_ = -1, bias_index_ = -1, in_local_ = 0;
};

}  // namespace trident
