#include "model/layers/parallel_linear.h"

#include "kernels/base/error.h"

namespace trident {

void ColumnParallelLinear::declare_parameters(ParameterDeclarations& d) {
  out_local_ = 0;
  for (size_t i = 0; i < parts_.size(); i++) {
    const Part& part = parts_[i];
    const int index = d.add({.name = part.name + ".weight",
                             .shape = {part.rows, in_},
                             .sharding = part.sharding,
                             .pieces = part.pieces,
                             .init = Init::normal,
                             .adjacent = i > 0,
                             .hidden_matrix = true});
    if (i == 0) weight_ = index;
    out_local_ += static_cast<int>(part.rows / part.pieces);
  }
  if (!bias_) return;
  for (size_t i = 0; i < parts_.size(); i++) {
    const Part& part = parts_[i];
    const int index = d.add({.name = part.name + ".bias",
                             .shape = {part.rows},
                             .sharding = part.sharding,
                             .pieces = part.pieces,
                             .init = Init::zeros,
                             .adjacent = i > 0});
    if (i == 0) bias_index_ = index;
  }
}

void ColumnParallelLinear::forward(LayerRuntime& r, int B, const kernels::Act* in_rows, kernels::Act* out) const {
  r.k.matmul_forward(out, r.regions.gathered_rows(in_rows, B), r.weight(weight_), r.weight(bias_index_), B * r.T, in_,
                     out_local_);
}

const kernels::Act* ColumnParallelLinear::backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout,
                                                   const kernels::Act* in_rows, kernels::Act* dinput) const {
  r.k.matmul_backward(dinput, p.defer ? nullptr : r.grad(weight_), p.defer ? nullptr : r.grad(bias_index_), dout,
                      p.defer ? nullptr : r.regions.gathered_rows(in_rows, p.B), r.weight(weight_), p.B * r.T, in_,
                      out_local_);
  return r.regions.reduce_gradient_rows(dinput, p.B);
}

void ColumnParallelLinear::weight_gradients(LayerRuntime& r, int B, const kernels::Act* dout,
                                            const kernels::Act* in_rows) const {
  r.k.matmul_backward(nullptr, r.grad(weight_), r.grad(bias_index_), dout, r.regions.gathered_rows(in_rows, B), nullptr,
                      B * r.T, in_, out_local_);
}

void RowParallelLinear::declare_parameters(ParameterDeclarations& d) {
  weight_ = d.add({.name = name_ + ".weight",
                   .shape = {out_, in_},
                   .sharding = Sharding::columns,
                   .pieces = d.tp_size(),
                   .init = Init::normal_residual,
                   .hidden_matrix = true});
  if (bias_) bias_index_ = d.add({.name = name_ + ".bias", .shape = {out_}, .init = Init::zeros});
  in_local_ = in_ / d.tp_size();
}

void RowParallelLinear::forward(LayerRuntime& r, int B, const kernels::Act* in, kernels::Act* out_rows) const {
  kernels::Act* out = r.regions.row_parallel_output(out_rows);
  const bool adds_bias = r.tp().rank() == 0;  // the replicated bias once, before the sum over tp
  r.k.matmul_forward(out, in, r.weight(weight_), adds_bias ? r.weight(bias_index_) : nullptr, B * r.T, in_local_, out_);
  r.regions.reduce_rows(out, out_rows, B);
}

void RowParallelLinear::backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout_rows,
                                 const kernels::Act* in, kernels::Act* dinput, kernels::Act* out_rows) const {
  if (p.defer)
    r.k.copy_on_device(out_rows, dout_rows, r.k.activation_bytes(static_cast<size_t>(r.regions.rows(p.B)) * out_));
  r.k.matmul_backward(dinput, p.defer ? nullptr : r.grad(weight_), p.defer ? nullptr : r.grad(bias_index_),
                      r.regions.gathered_rows(dout_rows, p.B), p.defer ? nullptr : in, r.weight(weight_), p.B * r.T,
                      in_local_, out_);
}

void RowParallelLinear::weight_gradients(LayerRuntime& r, int B, const kernels::Act* in,
                                         kernels::Act* out_rows) const {
  r.k.matmul_backward(nullptr, r.grad(weight_), r.grad(bias_index_), r.regions.gathered_rows(out_rows, B), in, nullptr,
                      B * r.T, in_local_, out_);
}

}  // namespace trident
