#include "model/layers/moe.h"

#include <algorithm>
#include <span>

#include "kernels/base/error.h"
#include "kernels/moe_router.h"
#include "parallel/communicator.h"

namespace trident {

namespace {


}  // namespace

MixtureOfExperts::MixtureOfExperts(MoeOptions o) : o_(std::move(o)) {
  check(o_.n_experts > 0 && o_.n_experts <= kernels::kMaxRouterExperts, "a mixture of 1 to 512 experts");
  check(o_.top_k > 0 && o_.top_k <= o_.n_experts, "top-k between 1 and the experts");
}

void MixtureOfExperts::declare_parameters(ParameterDeclarations& d) {
  const int tp = d.tp_size(), E = o_.n_experts;
  check(o_.ffn % tp == 0, "an expert's hidden width must divide over tp");
  F_ = o_.ffn / tp;
  router_ = d.add({.name = o_.router + ".weight", .shape = {E, o_.d_model}, .init = Init::normal});
  // Each expert's weights take part in K of E tokens' multiplies (the active parameters).
  const double active = static_cast<double>(o_.top_k) / E;
  experts_.resize(E);
  for (int e = 0; e < E; e++) {
    const std::string name = o_.experts + "." + std::to_string(e) + ".";
    experts_[e].gate_up = d.add({.name = name + o_.gate + ".weight", .shape = {o_.ffn, o_.d_model},
                                 .sharding = Sharding::rows, .pieces = tp, .init = Init::normal, .active = active});
    d.add({.name = name + o_.up + ".weight", .shape = {o_.ffn, o_.d_model}, .sharding = Sharding::rows, .pieces = tp,
           .init = Init::normal, .adjacent = true, .active = active});
    experts_[e].down = d.add({.name = name + o_.down + ".weight", .shape = {o_.d_model, o_.ffn},
                              .sharding = Sharding::columns, .pieces = tp, .init = Init::normal_residual,
                              .active = active});
  }
}

void MixtureOfExperts::declare_activations(ActivationDeclarations& a) {
  const size_t N = a.shape().tokens(), E = o_.n_experts, K = o_.top_k, C = o_.d_model, F = F_;
  const Retention rerun = Retention::dropped_by_full;
  logits_ = a.keep(N * E, Element::act, rerun);
  probs_ = a.keep(N * E, Element::f32, rerun);
  lse_ = a.keep(N, Element::f32, rerun);
  chosen_ = a.keep(N * K, Element::i32, rerun);
  weights_ = a.keep(N * K, Element::f32, rerun);
  rows_ = a.keep(N * K, Element::i32, rerun);
  // The balance loss's coefficients per (sequence, expert), and its statistics before
  // them: counted once per forward, so kept when the rest is recomputed.
  balance_ = a.keep(static_cast<size_t>(a.shape().micro_batch) * 2 * E, Element::f32);
  routed_ = a.keep(N * K * C, Element::act, rerun);
  gate_up_ = a.keep(N * K * 2 * F, Element::act, rerun);
  act_ = a.keep(N * K * F, Element::act, rerun);
  expert_out_ = a.keep(N * K * C, Element::act, rerun);
  a.scratch(dinput_, "d norm", N * C, Element::act);
  a.scratch(drouter_input_, "d moe router input", N * C, Element::act);
  a.scratch(drouted_, "d moe routed", N * K * C, Element::act);
  a.scratch(dgate_up_, "d moe gate up", N * K * 2 * F, Element::act);
  a.scratch(dact_, "d moe activation", N * K * F, Element::act);
  a.scratch(dexpert_out_, "d moe expert out", N * K * C, Element::act);
  a.scratch(dlogits_, "d moe logits", N * E, Element::act);
  a.scratch(dweights_, "d moe weights", N * K, Element::f32);
  a.gemm_output(2 * F_);
  a.gemm_output(o_.d_model);
  a.gemm_output(o_.n_experts);
  counts_.assign(a.shape().slots, std::vector<int>(E, 0));
}

void MixtureOfExperts::route(LayerRuntime& r, const Pass& p, bool count_losses) {
  const int N = p.B * r.T, E = o_.n_experts, K = o_.top_k;
  const size_t NK = static_cast<size_t>(N) * K;
  host_chosen_.resize(NK);
  r.k.copy_to_host(host_chosen_.data(), r.kept<int32_t>(p.slot, chosen_), NK * sizeof(int32_t));
  // Rows grouped by expert, in token order within each: the permutation dispatch applies.
  std::vector<int>& counts = counts_.at(p.slot);
  std::fill(counts.begin(), counts.end(), 0);
  for (int32_t e : host_chosen_) counts.at(e)++;
  std::vector<int32_t> next(E, 0);
  for (int e = 1; e < E; e++) next[e] = next[e - 1] + counts[e - 1];
  host_rows_.resize(NK);
  for (size_t i = 0; i < NK; i++) host_rows_[i] = next[host_chosen_[i]]++;
  r.k.upload(r.kept<int32_t>(p.slot, rows_), host_rows_.data(), NK * sizeof(int32_t));
  if (!count_losses) return;  // a recomputation: counted the first time

  // Per sequence: its tokens per expert and its probabilities' sums, over the whole
  // sequence (summed over the context-parallel ranks that hold its parts).
  host_probs_.resize(static_cast<size_t>(N) * E);
  host_lse_.resize(N);
  r.k.copy_to_host(host_probs_.data(), r.kept<float>(p.slot, probs_), host_probs_.size() * sizeof(float));
  r.k.copy_to_host(host_lse_.data(), r.kept<float>(p.slot, lse_), host_lse_.size() * sizeof(float));
  const size_t stats_floats = static_cast<size_t>(p.B) * 2 * E;
  host_stats_.assign(stats_floats, 0.0f);
  for (int t = 0; t < N; t++) {
    float* s = host_stats_.data() + static_cast<size_t>(t / r.T) * 2 * E;
    for (int j = 0; j < K; j++) s[host_chosen_[static_cast<size_t>(t) * K + j]] += 1;
    for (int e = 0; e < E; e++) s[E + e] += host_probs_[static_cast<size_t>(t) * E + e];
  }
  float* balance = r.kept<float>(p.slot, balance_);
  if (r.context != nullptr) {
    r.k.copy_to_device(balance, host_stats_.data(), stats_floats * sizeof(float));
    r.context->all_reduce(std::span<float>(balance, stats_floats));
    r.k.copy_to_host(host_stats_.data(), balance, stats_floats * sizeof(float));
  }
  const double T = o_.seq_len, experts = E;
  double aux = 0, z = 0;
  std::vector<float> coefficients(static_cast<size_t>(p.B) * E);
  for (int b = 0; b < p.B; b++) {
    const float* s = host_stats_.data() + static_cast<size_t>(b) * 2 * E;
    for (int e = 0; e < E; e++) {
      aux += o_.aux_loss_coef * experts / (K * T * T) * s[e] * s[E + e];
      // d aux / d p(t, e) = aux_coef E count(s, e) / (K T^2) / batch: the 1 / (batch T)
      // is backward's loss_scale.
      coefficients[static_cast<size_t>(b) * E + e] = static_cast<float>(o_.aux_loss_coef * experts / (K * T) * s[e]);
    }
  }
  for (float l : host_lse_) z += static_cast<double>(l) * l;
  r.k.copy_to_device(balance, coefficients.data(), coefficients.size() * sizeof(float));
  // The sequence's loss once (every cp rank has it), each token's z term where it is.
  if (r.router == nullptr) return;
  r.router->aux_loss_sum += (r.context == nullptr || r.context->rank() == 0 ? aux : 0.0) + o_.z_loss_coef * z / T;
  double* tokens = r.router->tokens.data() + static_cast<size_t>(o_.layer) * E;
  for (int e = 0; e < E; e++) tokens[e] += counts[e];
}

void MixtureOfExperts::expert_gemms(LayerRuntime& r, int slot, const Act* x, int x_width, Act* out, int out_width,
                                    int Expert::*weight) const {
  const kernels::DType type = r.k.activation_type();
  size_t row = 0;
  for (size_t e = 0; e < experts_.size(); e++) {
    const int rows = counts_[slot][e];
    if (rows > 0)
      r.k.matmul_forward(kernels::offset(out, row * out_width, type), kernels::offset(x, row * x_width, type),
                         r.weight(experts_[e].*weight), nullptr, rows, x_width, out_width);
    row += rows;
  }
}

void MixtureOfExperts::forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed) {
  const int N = p.B * r.T, E = o_.n_experts, K = o_.top_k, C = o_.d_model;
  const Act* x = r.regions.gathered_rows(in, p.B);  // the router and the experts see every row
  Act* logits = r.kept(p.slot, logits_);
  r.k.matmul_forward(logits, x, r.weight(router_), nullptr, N, C, E);
  r.k.moe_router_forward(r.kept<float>(p.slot, probs_), r.kept<float>(p.slot, lse_), r.kept<int32_t>(p.slot, chosen_),
                         r.kept<float>(p.slot, weights_), logits, N, E, K, o_.renormalize);
  route(r, p, /*count_losses=*/output_needed);
  Act *routed = r.kept(p.slot, routed_), *gate_up = r.kept(p.slot, gate_up_), *act = r.kept(p.slot, act_);
  Act* expert_out = r.kept(p.slot, expert_out_);
  const int32_t* rows = r.kept<int32_t>(p.slot, rows_);
  r.k.moe_dispatch(routed, x, rows, N, K, C);
  expert_gemms(r, p.slot, routed, C, gate_up, 2 * F_, &Expert::gate_up);
  r.k.swiglu_forward(act, gate_up, N * K, F_);
  expert_gemms(r, p.slot, act, F_, expert_out, C, &Expert::down);
  r.store.progress_gathers();
  if (!output_needed) return;
  // Each rank's experts' columns gave partial outputs: summed over tp as a row-parallel layer's.
  Act* partial = r.regions.row_parallel_output(out);
  r.k.moe_combine(partial, expert_out, r.kept<float>(p.slot, weights_), rows, N, K, C);
  r.regions.reduce_rows(partial, out, p.B);
}

const kernels::Act* MixtureOfExperts::backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout,
                                               Act* /*out*/) {
  const int N = p.B * r.T, E = o_.n_experts, K = o_.top_k, C = o_.d_model;
  const kernels::DType type = r.k.activation_type();
  Act *routed = r.kept(p.slot, routed_), *gate_up = r.kept(p.slot, gate_up_), *act = r.kept(p.slot, act_);
  Act* expert_out = r.kept(p.slot, expert_out_);
  const int32_t* rows = r.kept<int32_t>(p.slot, rows_);
  const float* weights = r.kept<float>(p.slot, weights_);
  const size_t NK = static_cast<size_t>(N) * K;
  // Through the combination: each routed row's gradient, and each routing weight's (a
  // dot product over the output's columns, of which this rank's experts gave a part).
  r.k.moe_combine_backward(dexpert_out_, dweights_, r.regions.gathered_rows(dout, p.B), expert_out, weights, rows, N,
                           K, C);
  r.tp().sum_routing_weight_gradients(dweights_, NK);
  // Through each expert: down, SwiGLU, gate | up.
  size_t row = 0;
  for (int e = 0; e < E; e++) {
    const int n = counts_[p.slot][e];
    if (n > 0)
      r.k.matmul_backward(kernels::offset(dact_, row * F_, type), p.defer ? nullptr : r.grad(experts_[e].down),
                          nullptr, kernels::offset(dexpert_out_, row * C, type),
                          p.defer ? nullptr : kernels::offset(act, row * F_, type), r.weight(experts_[e].down), n, F_,
                          C);
    row += n;
  }
  r.k.swiglu_backward(dgate_up_, gate_up, dact_, static_cast<int>(NK), F_);
  if (p.defer) {  // the weight half reads the outputs' gradients where the outputs were
    r.k.copy_on_device(expert_out, dexpert_out_, r.k.activation_bytes(NK * C));
    r.k.copy_on_device(gate_up, dgate_up_, r.k.activation_bytes(NK * 2 * F_));
  }
  row = 0;
  for (int e = 0; e < E; e++) {
    const int n = counts_[p.slot][e];
    if (n > 0)
      r.k.matmul_backward(kernels::offset(drouted_, row * C, type), p.defer ? nullptr : r.grad(experts_[e].gate_up),
                          nullptr, kernels::offset(dgate_up_, row * 2 * F_, type),
                          p.defer ? nullptr : kernels::offset(routed, row * C, type), r.weight(experts_[e].gate_up), n,
                          C, 2 * F_);
    row += n;
  }
  r.k.moe_dispatch_backward(dinput_, drouted_, rows, N, K, C);
  // The router (replicated, every rank the same: its input's gradient added once, by tp
  // rank 0, before the sum over tp). Its weight's gradient is taken now under zb1 too.
  const bool balanced = o_.aux_loss_coef != 0;
  r.k.moe_router_backward(dlogits_, r.kept<float>(p.slot, probs_), r.kept<float>(p.slot, lse_),
                          r.kept<int32_t>(p.slot, chosen_), weights, dweights_,
                          balanced ? r.kept<float>(p.slot, balance_) : nullptr, r.T, p.loss_scale,
                          static_cast<float>(o_.z_loss_coef) * p.loss_scale, N, E, K, o_.renormalize);
  r.k.matmul_backward(drouter_input_, r.grad(router_), nullptr, dlogits_, r.regions.gathered_rows(in, p.B),
                      r.weight(router_), N, C, E);
  if (r.tp().rank() == 0) r.k.add(dinput_, dinput_, drouter_input_, static_cast<size_t>(N) * C);
  return r.regions.reduce_gradient_rows(dinput_, p.B);
}

void MixtureOfExperts::weight_gradients(LayerRuntime& r, const Pass& p, const Act* /*in*/, Act* /*out*/) {
  const kernels::DType type = r.k.activation_type();
  const int C = o_.d_model;
  Act *routed = r.kept(p.slot, routed_), *gate_up = r.kept(p.slot, gate_up_), *act = r.kept(p.slot, act_);
  Act* expert_out = r.kept(p.slot, expert_out_);  // the gradients backward left there
  size_t row = 0;
  for (size_t e = 0; e < experts_.size(); e++) {
    const int n = counts_[p.slot][e];
    if (n > 0) {
      r.k.matmul_backward(nullptr, r.grad(experts_[e].down), nullptr, kernels::offset(expert_out, row * C, type),
                          kernels::offset(act, row * F_, type), nullptr, n, F_, C);
      r.k.matmul_backward(nullptr, r.grad(experts_[e].gate_up), nullptr, kernels::offset(gate_up, row * 2 * F_, type),
                          kernels::offset(routed, row * C, type), nullptr, n, C, 2 * F_);
    }
    row += n;
  }
}

}  // namespace trident
