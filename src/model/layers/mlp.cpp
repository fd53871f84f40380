#include "model/layers/mlp.h"

#include "kernels/base/error.h"

namespace trident {

namespace {

std::vector<ColumnParallelLinear::Part> in_parts(const MlpOptions& o) {
  std::vector<ColumnParallelLinear::Part> parts;
  for (const std::string& name : o.in) parts.push_back({name, o.ffn, 0});  // pieces: tp, set when declared
  return parts;
}

}  // namespace

Mlp::Mlp(MlpOptions o) : o_(std::move(o)), in_({}, o_.d_model, o_.bias), out_(o_.out, o_.d_model, o_.ffn, o_.bias) {
  check(o_.in.size() == (swiglu() ? 2u : 1u), "the MLP's input projection: one tensor for GELU, gate and up for SwiGLU");
}

void Mlp::declare_parameters(ParameterDeclarations& d) {
  std::vector<ColumnParallelLinear::Part> parts = in_parts(o_);
  for (auto& part : parts) part.pieces = d.tp_size();
  in_ = ColumnParallelLinear(std::move(parts), o_.d_model, o_.bias);
  in_.declare_parameters(d);
  out_.declare_parameters(d);
}

void Mlp::declare_activations(ActivationDeclarations& a) {
  const size_t BT = a.shape().tokens();
  fc_ = a.keep(BT * in_.out_local(), Element::act, Retention::dropped_by_full);
  fc_act_ = a.keep(BT * out_.in_local(), Element::act, Retention::dropped_by_full);
  a.scratch(dinput_, "d norm", BT * o_.d_model, Element::act);
  a.scratch(dfc_, "d mlp in", BT * in_.out_local(), Element::act);
  // GELU's backward runs in place; SwiGLU's reads d(activation) [BT, ffn] and writes
  // d(gate | up) [BT, 2 ffn], so it needs a buffer of its own.
  if (swiglu()) a.scratch(dfc_act_, "d mlp activation", BT * out_.in_local(), Element::act);
  else a.scratch(dfc_act_, "d mlp in", BT * in_.out_local(), Element::act);
  a.gemm(BT, o_.d_model, in_.out_local());
  a.gemm(BT, out_.in_local(), o_.d_model);
}

void Mlp::forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed) {
  Act *fc = r.kept(p.slot, fc_), *fc_act = r.kept(p.slot, fc_act_);
  const int BT = p.B * r.T, ffn = out_.in_local();
  in_.forward(r, p.B, in, fc);
  if (swiglu()) r.k.swiglu_forward(fc_act, fc, BT, ffn);
  else r.k.gelu_forward(fc_act, fc, static_cast<size_t>(BT) * ffn);
  r.store.progress_gathers();
  if (output_needed) out_.forward(r, p.B, fc_act, out);
}

const kernels::Act* Mlp::backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) {
  Act *fc = r.kept(p.slot, fc_), *fc_act = r.kept(p.slot, fc_act_);
  const int BT = p.B * r.T, ffn = out_.in_local();
  out_.backward(r, p, dout, fc_act, dfc_act_, out);
  if (swiglu()) r.k.swiglu_backward(dfc_, fc, dfc_act_, BT, ffn);
  else r.k.gelu_backward(dfc_, fc, dfc_act_, static_cast<size_t>(BT) * ffn);
  // Deferred: the projection's output gradient waits in its output buffer (no longer needed).
  if (p.defer) r.k.copy_on_device(fc, dfc_, r.k.activation_bytes(static_cast<size_t>(BT) * in_.out_local()));
  return in_.backward(r, p, dfc_, in, dinput_);
}

void Mlp::weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) {
  out_.weight_gradients(r, p.B, r.kept(p.slot, fc_act_), out);
  in_.weight_gradients(r, p.B, r.kept(p.slot, fc_), in);
}

}  // namespace trident
