#include "model/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>

#include "kernels/base/error.h"
#include "kernels/moe_router.h"
#include "model/context_parallel.h"
#include "parallel/communicator.h"

namespace trident {

std::string dropless_rows_held(const TransformerSpec& spec, int ep, const ModelConfig& model) {
  if (ep <= 1 || model.moe_capacity_factor > 0 || spec.n_experts == 0) return "";
  // (At most every rank's tokens to each local expert: ep min(K, local) / K shares.)
  const int K = spec.experts_per_token, local = spec.n_experts / ep;
  char words[96];
  std::snprintf(words, sizeof words, ", experts' rows received at %.2fx the balanced share",
                std::min(model.moe_dropless_headroom, static_cast<double>(ep * std::min(K, local)) / K));
  return words;
}

namespace {
// An expert lives on one rank of each ep group; the ranks at its place in every group
// hold it and sum its gradient (model/placement.h).
constexpr AxisSet kExpert = {MeshAxis::ep};
constexpr AxisSet kExpertHolders = {MeshAxis::edp};
}  // namespace

MixtureOfExperts::MixtureOfExperts(MoeOptions o) : o_(std::move(o)) {
  // The CPU router kernels keep a token's scores in arrays of kMaxRouterExperts (the CUDA
  // ones have no limit of their own).
  check(o_.n_experts > 0 && o_.n_experts <= kernels::kMaxRouterExperts, "a mixture of 1 to 512 experts");
  check(o_.top_k > 0 && o_.top_k <= o_.n_experts, "top-k between 1 and the experts");
}

void MixtureOfExperts::declare_parameters(ParameterDeclarations& d) {
  const int tp = d.tp_size(), E = o_.n_experts;
  check(o_.ffn % tp == 0, "an expert's hidden width must divide over tp");
  check(E % d.ep_size() == 0, "the experts must divide over ep");
  F_ = o_.ffn / tp;
  ep_ = d.ep_size();
  const int local = E / ep_;
  first_expert_ = d.ep_rank() * local;
  router_ = d.add({.name = o_.router + ".weight", .shape = {E, o_.d_model}, .init = Init::normal});
  // Each expert's weights take part in K of E tokens' multiplies (the active parameters).
  const double active = static_cast<double>(o_.top_k) / E;
  experts_.resize(local);
  for (int i = 0; i < local; i++) {
    const std::string name = o_.experts + "." + std::to_string(first_expert_ + i) + ".";
    experts_[i].gate_up = d.add({.name = name + o_.gate + ".weight", .shape = {o_.ffn, o_.d_model},
                                 .sharding = Sharding::rows, .pieces = tp, .init = Init::normal, .active = active,
                                 .sharded_over = kExpert, .summed_over = kExpertHolders, .hidden_matrix = true});
    d.add({.name = name + o_.up + ".weight", .shape = {o_.ffn, o_.d_model}, .sharding = Sharding::rows, .pieces = tp,
           .init = Init::normal, .adjacent = true, .active = active, .sharded_over = kExpert,
           .summed_over = kExpertHolders, .hidden_matrix = true});
    experts_[i].down = d.add({.name = name + o_.down + ".weight", .shape = {o_.d_model, o_.ffn},
                              .sharding = Sharding::columns, .pieces = tp, .init = Init::normal_residual,
                              .active = active, .sharded_over = kExpert, .summed_over = kExpertHolders,
                              .hidden_matrix = true});
  }
  // Loss-free balancing's expert bias: a buffer every rank holds whole, moved after each
  // step by the load summed over the data-parallel ranks (update_buffers).
  if (o_.bias_update_rate > 0)
    expert_bias_ = d.add({.name = o_.router + ".e_score_correction_bias", .shape = {E}, .init = Init::zeros,
                          .multiplied = false, .kind = StateKind::buffer});
  if (expert_bias_ >= 0) bias_offset_ = d.buffer_offset(expert_bias_);
}

void MixtureOfExperts::declare_activations(ActivationDeclarations& a) {
  const size_t N = a.shape().tokens(), E = o_.n_experts, K = o_.top_k, C = o_.d_model, F = F_;
  const Retention rerun = Retention::dropped_by_full;
  logits_ = a.keep(N * E, Element::f32, rerun);  // fp32 under bf16 too: near ties stay apart
  probs_ = a.keep(N * E, Element::f32, rerun);
  lse_ = a.keep(N, Element::f32, rerun);
  chosen_ = a.keep(N * K, Element::i32, rerun);
  weights_ = a.keep(N * K, Element::f32, rerun);
  rows_ = a.keep(N * K, Element::i32, rerun);
  // The balance loss's statistics per (sequence, expert), then its coefficients: counted
  // once per forward, so kept when the rest is recomputed.
  balance_ = a.keep(static_cast<size_t>(a.shape().micro_batch) * 3 * E, Element::f32);  // [B, 2E] then [B, E]
  // The routed rows and what their experts gave back; the experts' own rows are these
  // (without expert parallelism) or what the exchange brings (ExpertSide).
  routed_ = a.keep(N * K * C, Element::act, rerun);
  expert_out_ = a.keep(N * K * C, Element::act, rerun);
  expert_rows_ = ep_ > 1 ? received_rows_held(a.shape().micro_batch, N) : N * K;
  gate_up_ = a.keep(expert_rows_ * 2 * F, Element::act, rerun);
  act_ = a.keep(expert_rows_ * F, Element::act, rerun);
  if (ep_ > 1) {  // the rows this rank's experts receive
    order_ = a.keep(expert_rows_, Element::i32, rerun);
    received_ = a.keep(expert_rows_ * C, Element::act, rerun);
    received_out_ = a.keep(expert_rows_ * C, Element::act, rerun);
  }
  a.scratch(dinput_, "d norm", N * C, Element::act);
  a.scratch(drouter_input_, "d moe router input", N * C, Element::act);
  a.scratch(drouted_, "d moe routed", N * K * C, Element::act);
  a.scratch(dexpert_out_, "d moe expert out", N * K * C, Element::act);
  a.scratch(dgate_up_, "d moe gate up", expert_rows_ * 2 * F, Element::act);
  a.scratch(dact_, "d moe activation", expert_rows_ * F, Element::act);
  if (ep_ > 1) {
    a.scratch(transfer_, "moe exchange", expert_rows_ * C, Element::act);
    a.scratch(d_x_, "d moe received", expert_rows_ * C, Element::act);
  }
  a.scratch(counts_device_, "moe expert counts", static_cast<size_t>(ep_) * E, Element::f32);
  a.scratch(token_totals_, "moe sigmoid totals", N, Element::f32);
  a.scratch(dlogits_, "d moe logits", N * E, Element::act);
  a.scratch(dweights_, "d moe weights", N * K, Element::f32);
  a.gemm(expert_rows_, C, 2 * F);  // an expert's rows: at most every row of the expert side
  a.gemm(expert_rows_, F, C);
  a.gemm(N, C, E);  // the router
  counts_.assign(a.shape().slots, std::vector<int>(E, 0));
  slot_rows_.assign(a.shape().slots, {});
  every_ranks_counts_.assign(a.shape().slots, {});
  exchanges_.clear();
  exchanges_.resize(ep_ > 1 ? a.shape().slots : 0);
}

void MixtureOfExperts::route(LayerRuntime& r, const Pass& p, bool count_losses) {
  const int E = o_.n_experts;
  SlotRows& slot_rows = slot_rows_.at(p.slot);
  slot_rows.routed = static_cast<size_t>(p.B) * r.T * o_.top_k;
  if (o_.capacity_factor > 0) route_with_capacity(r, p);
  else route_dropless(r, p, /*recomputing=*/!count_losses);
  const std::vector<int>& counts = counts_.at(p.slot);
  if (!count_losses) return;  // a recomputation: counted the first time
  count_balance(r, p);
  if (r.router == nullptr) return;
  // The router's choices, before any drop (those are counted as rows not computed).
  double* tokens = r.router->tokens.data() + static_cast<size_t>(o_.layer) * E;
  if (o_.capacity_factor > 0)
    for (int32_t e : host_chosen_) tokens[e] += 1;
  else
    for (int e = 0; e < E; e++) tokens[e] += counts[e];
}

void MixtureOfExperts::route_dropless(LayerRuntime& r, const Pass& p, bool recomputing) {
  const int E = o_.n_experts;
  const size_t NK = slot_rows_.at(p.slot).routed;
  // Under expert parallelism this rank's counts go in its block of every ep rank's: one
  // all-gather on the device, then one read of all of them (send_to_experts needs them).
  const int rank = ep_ > 1 ? r.experts->rank() : 0;
  float* mine = counts_device_ + static_cast<size_t>(rank) * E;
  r.k.moe_permute(r.kept<int32_t>(p.slot, rows_), mine, r.kept<int32_t>(p.slot, chosen_), static_cast<int>(NK), E);
  slot_rows_.at(p.slot).kept = NK;
  // A recomputation routes as the forward did (the same inputs, the same kernels): its
  // counts are the slot's already.
  if (recomputing) return;
  std::vector<float>& all = every_ranks_counts_.at(p.slot);
  all.resize(static_cast<size_t>(ep_) * E);
  if (ep_ > 1) r.experts->all_gather(std::span<float>(counts_device_, all.size()));
  // The layer's one wait for the device: the grouped GEMMs take their rows on the host.
  r.k.copy_to_host(all.data(), counts_device_, all.size() * sizeof(float));
  std::vector<int>& counts = counts_.at(p.slot);
  for (int e = 0; e < E; e++) counts[e] = static_cast<int>(all[static_cast<size_t>(rank) * E + e]);
}

void MixtureOfExperts::route_with_capacity(LayerRuntime& r, const Pass& p) {
  const int E = o_.n_experts;
  const size_t NK = slot_rows_.at(p.slot).routed;
  host_chosen_.resize(NK);
  r.k.copy_to_host(host_chosen_.data(), r.kept<int32_t>(p.slot, chosen_), NK * sizeof(int32_t));
  host_dropped_.assign(NK, 0);
  drop_over_capacity(r, p);
  // Rows grouped by expert, in token order within each: the permutation dispatch applies.
  // The dropped pairs' rows come after every expert's: no expert reads them.
  std::vector<int>& counts = counts_.at(p.slot);
  std::fill(counts.begin(), counts.end(), 0);
  size_t& kept = slot_rows_.at(p.slot).kept;
  kept = 0;
  for (size_t i = 0; i < NK; i++)
    if (!host_dropped_[i]) {
      counts.at(host_chosen_[i])++;
      kept++;
    }
  std::vector<int32_t> next(E, 0);
  for (int e = 1; e < E; e++) next[e] = next[e - 1] + counts[e - 1];
  auto dropped_row = static_cast<int32_t>(kept);
  host_rows_.resize(NK);
  for (size_t i = 0; i < NK; i++) host_rows_[i] = host_dropped_[i] ? dropped_row++ : next[host_chosen_[i]]++;
  r.k.upload(r.kept<int32_t>(p.slot, rows_), host_rows_.data(), NK * sizeof(int32_t));
  if (ep_ == 1) return;
  // Every ep rank's rows per expert (small integers: exact in floats), for send_to_experts.
  std::vector<float>& all = every_ranks_counts_.at(p.slot);
  all.assign(static_cast<size_t>(ep_) * E, 0.0f);
  for (int e = 0; e < E; e++) all[static_cast<size_t>(r.experts->rank()) * E + e] = static_cast<float>(counts[e]);
  all_gather_host(r, *r.experts, all);
}

void MixtureOfExperts::count_balance(LayerRuntime& r, const Pass& p) {
  // Per sequence: its tokens per expert and its normalized scores' sums, over the whole
  // sequence (summed over the context-parallel ranks that hold its parts), then the loss's
  // coefficients and value, all on the device.
  const int N = p.B * r.T, E = o_.n_experts;
  const size_t stats = static_cast<size_t>(p.B) * 2 * E;
  float* balance = r.kept<float>(p.slot, balance_);
  r.k.moe_balance_statistics(balance, token_totals_, r.kept<int32_t>(p.slot, chosen_), r.kept<float>(p.slot, probs_),
                             N, r.T, E, o_.top_k, o_.sigmoid);
  if (r.context != nullptr) r.context->all_reduce(std::span<float>(balance, stats));
  // The sequence's loss once (every cp rank has it), each token's z term where it is.
  const bool with_aux = r.context == nullptr || r.context->rank() == 0;
  r.k.moe_balance_loss(balance + stats, r.router != nullptr ? r.router->aux_loss_on_device : nullptr, balance,
                       r.kept<float>(p.slot, lse_), p.B, N, E, o_.top_k, o_.seq_len, o_.aux_loss_coef,
                       o_.z_loss_coef, with_aux);
}

void MixtureOfExperts::all_gather_host(LayerRuntime& r, Communicator& group, std::vector<float>& values) {
  const size_t bytes = values.size() * sizeof(float);
  if (gathered_.size() < values.size()) gathered_ = kernels::DeviceBuffer(r.k, values.size());
  r.k.copy_to_device(gathered_.data(), values.data(), bytes);
  group.all_gather(std::span<float>(gathered_.data(), values.size()));
  r.k.copy_to_host(values.data(), gathered_.data(), bytes);
}

void MixtureOfExperts::drop_over_capacity(LayerRuntime& r, const Pass& p) {
  const int N = p.B * r.T, E = o_.n_experts, K = o_.top_k;
  const size_t NK = static_cast<size_t>(N) * K;
  // Each pair as (expert, weight, position in its sequence): small integers, exact in
  // floats. The weight ranks the pairs, as Megatron's "probs" policy: the routing weight,
  // after the renormalization.
  host_weights_.resize(NK);
  float* weights = r.kept<float>(p.slot, weights_);
  r.k.copy_to_host(host_weights_.data(), weights, NK * sizeof(float));
  const int cp = r.context != nullptr ? r.context->size() : 1, cp_rank = r.context != nullptr ? r.context->rank() : 0;
  std::vector<int32_t> positions(r.T);
  if (cp > 1) positions = context_positions(o_.seq_len, cp, cp_rank);
  else
    for (int t = 0; t < r.T; t++) positions[t] = t;
  host_pairs_.assign(static_cast<size_t>(cp) * NK * 3, 0.0f);
  float* mine = host_pairs_.data() + static_cast<size_t>(cp_rank) * NK * 3;
  for (size_t i = 0; i < NK; i++) {
    const size_t t = i / K;
    mine[3 * i] = static_cast<float>(host_chosen_[i]);
    // A NaN (a step the trainer will skip) ranks lowest: the sort needs a strict order.
    mine[3 * i + 1] = std::isnan(host_weights_[i]) ? -INFINITY : host_weights_[i];
    mine[3 * i + 2] = static_cast<float>(positions[t % r.T]);
  }
  if (cp > 1) all_gather_host(r, *r.context, host_pairs_);
  // Per sequence and expert, its pairs from every cp rank in the order they keep their place.
  const size_t capacity = capacity_per_sequence();
  struct Pair {
    float score, position;
    int rank;
    size_t index;
  };
  std::vector<std::vector<Pair>> lists(static_cast<size_t>(p.B) * E);
  for (int q = 0; q < cp; q++)
    for (size_t i = 0; i < NK; i++) {
      const float* pair = host_pairs_.data() + (static_cast<size_t>(q) * NK + i) * 3;
      const size_t b = i / K / r.T;
      lists[b * E + static_cast<size_t>(pair[0])].push_back({pair[1], pair[2], q, i});
    }
  const bool by_position = o_.drop_by_position;
  for (std::vector<Pair>& list : lists) {
    if (list.size() <= capacity) continue;
    std::sort(list.begin(), list.end(), [by_position](const Pair& a, const Pair& b) {
      if (!by_position && a.score != b.score) return a.score > b.score;
      return a.position < b.position;
    });
    for (size_t n = capacity; n < list.size(); n++)
      if (list[n].rank == cp_rank) host_dropped_[list[n].index] = 1;
  }
  for (size_t i = 0; i < NK; i++)
    if (host_dropped_[i]) host_weights_[i] = 0;
  r.k.copy_to_device(weights, host_weights_.data(), NK * sizeof(float));
}

MixtureOfExperts::ExpertSide MixtureOfExperts::expert_side(LayerRuntime& r, int slot) {
  if (ep_ == 1) {
    const std::vector<int>& counts = counts_.at(slot);
    size_t rows = 0;
    for (int n : counts) rows += n;
    return {r.kept(slot, routed_), r.kept(slot, gate_up_), r.kept(slot, act_), r.kept(slot, expert_out_), &counts, rows};
  }
  Exchange& x = exchanges_.at(slot);
  if (x.rows <= expert_rows_)
    return {r.kept(slot, received_), r.kept(slot, gate_up_), r.kept(slot, act_), r.kept(slot, received_out_),
            &x.local_counts, x.rows};
  return {kept_beyond(r, slot, kX, x.rows * o_.d_model), kept_beyond(r, slot, kGateUp, x.rows * 2 * F_),
          kept_beyond(r, slot, kAct, x.rows * F_), kept_beyond(r, slot, kOut, x.rows * o_.d_model), &x.local_counts,
          x.rows};
}

size_t MixtureOfExperts::received_rows_held(int sequences, size_t N) const {
  const size_t K = o_.top_k, local = o_.n_experts / ep_;
  // At most, from each of the ep ranks, a row per token and local expert it goes to.
  const size_t most = ep_ * N * std::min(K, local);
  // Dropless: the headroom times the balanced share (as many rows as this rank sends); more
  // arrive when the routing favours its experts still more (the data decides: GrowingScratch).
  if (o_.capacity_factor <= 0)
    return std::min(most, static_cast<size_t>(std::ceil(o_.dropless_headroom * static_cast<double>(N * K))));
  // A capacity factor bounds them: for each local expert, its capacity per sequence.
  return std::min(ep_ * local * std::min(N, static_cast<size_t>(sequences) * capacity_per_sequence()), most);
}

size_t MixtureOfExperts::capacity_per_sequence() const {
  return static_cast<size_t>(std::ceil(o_.capacity_factor * o_.seq_len * o_.top_k / o_.n_experts));
}

kernels::Act* MixtureOfExperts::kept_beyond(LayerRuntime& r, int slot, Beyond which, size_t elements) const {
  check(r.growing != nullptr, "a mixture's rows beyond the arena without growing scratch");
  return static_cast<Act*>(r.growing->at_least(this, slot, which, r.k, r.k.activation_bytes(elements)));
}

kernels::Act* MixtureOfExperts::room(LayerRuntime& r, Act* declared, Beyond which, size_t rows, size_t width) const {
  if (rows <= expert_rows_) return declared;
  check(r.growing != nullptr, "a mixture's rows beyond the arena without growing scratch");
  // Scratch: one buffer for the stage's layers.
  return static_cast<Act*>(r.growing->at_least(nullptr, 0, which, r.k, r.k.activation_bytes(rows * width)));
}

const int32_t* MixtureOfExperts::order(LayerRuntime& r, int slot) {
  const Exchange& x = exchanges_.at(slot);
  if (x.rows <= expert_rows_) return r.kept<int32_t>(slot, order_);
  check(r.growing != nullptr, "a mixture's rows beyond the arena without growing scratch");
  return static_cast<const int32_t*>(r.growing->at_least(this, slot, kOrder, r.k, x.rows * sizeof(int32_t)));
}

void MixtureOfExperts::send_to_experts(LayerRuntime& r, const Pass& p, const Act* routed) {
  check(r.experts != nullptr && r.experts->size() == ep_, "expert parallelism without its group");
  const int E = o_.n_experts, local = E / ep_, C = o_.d_model;
  // Every ep rank's rows per expert, as route() gathered them.
  const std::vector<int>& counts = counts_.at(p.slot);
  const std::vector<float>& all = every_ranks_counts_.at(p.slot);
  Exchange& x = exchanges_.at(p.slot);
  x.sent.assign(ep_, 0);
  x.received.assign(ep_, 0);
  x.local_counts.assign(local, 0);
  // The routed rows are grouped by expert, so rank q's are one block: its experts' rows.
  for (int q = 0; q < ep_; q++)
    for (int l = 0; l < local; l++) x.sent[q] += counts[q * local + l];
  std::vector<int> from(static_cast<size_t>(ep_) * local);  // rows from rank s for local expert l
  for (int s = 0; s < ep_; s++)
    for (int l = 0; l < local; l++) {
      const int n = static_cast<int>(all[static_cast<size_t>(s) * E + first_expert_ + l]);
      from[static_cast<size_t>(s) * local + l] = n;
      x.received[s] += n;
      x.local_counts[l] += n;
    }
  x.rows = 0;
  for (size_t n : x.received) x.rows += n;
  // They arrive by sender, each sender's grouped by expert; the GEMMs want them grouped
  // by expert: arrival row i goes to row grouped[i] (the slot's order()).
  std::vector<int32_t> grouped(x.rows);
  std::vector<int32_t> next(local, 0);
  for (int l = 1; l < local; l++) next[l] = next[l - 1] + x.local_counts[l - 1];
  size_t i = 0;
  for (int s = 0; s < ep_; s++)
    for (int l = 0; l < local; l++)
      for (int n = 0; n < from[static_cast<size_t>(s) * local + l]; n++) grouped[i++] = next[l]++;
  // More than the arena holds (buffers of their own: expert_side, order) only when dropless.
  check(x.rows <= expert_rows_ || o_.capacity_factor <= 0, "a mixture's received rows over its capacity's bound");
  if (x.rows > 0) r.k.upload(const_cast<int32_t*>(order(r, p.slot)), grouped.data(), x.rows * sizeof(int32_t));
  exchange(r, p.slot, routed, expert_side(r, p.slot).x, C, /*towards_experts=*/true);
}

void MixtureOfExperts::zero_dropped_rows(LayerRuntime& r, int slot, Act* rows) const {
  const SlotRows& n = slot_rows_.at(slot);
  if (n.kept == n.routed) return;
  const size_t C = o_.d_model;
  r.k.fill_zero(kernels::offset(rows, n.kept * C, r.k.activation_type()), r.k.activation_bytes((n.routed - n.kept) * C));
}

void MixtureOfExperts::exchange(LayerRuntime& r, int slot, const Act* from, Act* to, int width, bool towards_experts) {
  const Exchange& x = exchanges_.at(slot);
  std::vector<size_t> mine(ep_), theirs(ep_);  // elements: of this rank's tokens, of its experts'
  size_t token_rows = 0;
  for (int q = 0; q < ep_; q++) {
    mine[q] = x.sent[q] * width;
    theirs[q] = x.received[q] * width;
    token_rows += x.sent[q];
  }
  const kernels::DType type = r.k.activation_type();
  Act* transfer = room(r, transfer_, kTransfer, x.rows, width);
  const int32_t* grouped = order(r, slot);
  const int rows = static_cast<int>(x.rows);
  if (towards_experts) {
    r.experts->all_to_all_v({const_cast<Act*>(from), token_rows * width, type}, mine, {transfer, x.rows * width, type},
                            theirs);
    if (rows > 0) r.k.moe_dispatch(to, transfer, grouped, rows, 1, width);
  } else {
    if (rows > 0) r.k.moe_dispatch_backward(transfer, from, grouped, rows, 1, width);
    r.experts->all_to_all_v({transfer, x.rows * width, type}, theirs, {to, token_rows * width, type}, mine);
  }
}

std::vector<const kernels::Act*> MixtureOfExperts::expert_weights(LayerRuntime& r, int Expert::*which) const {
  std::vector<const Act*> w;
  for (const Expert& x : experts_) w.push_back(r.weight(x.*which));
  return w;
}

std::vector<float*> MixtureOfExperts::expert_gradients(LayerRuntime& r, int Expert::*which) const {
  std::vector<float*> g;
  for (const Expert& x : experts_) g.push_back(r.grad(x.*which));
  return g;
}

void MixtureOfExperts::forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed) {
  const int N = p.B * r.T, E = o_.n_experts, K = o_.top_k, C = o_.d_model;
  const Act* x = r.regions.gathered_rows(in, p.B);  // the router and the experts see every row
  float* logits = r.kept<float>(p.slot, logits_);
  r.k.matmul_forward_f32(logits, x, r.weight(router_), N, C, E);
  r.k.moe_router_forward(r.kept<float>(p.slot, probs_), r.kept<float>(p.slot, lse_), r.kept<int32_t>(p.slot, chosen_),
                         r.kept<float>(p.slot, weights_), logits, expert_bias(r), N, E, K, o_.renormalize,
                         o_.sigmoid);
  if (output_needed && r.routing != nullptr) {
    RoutingRecord::Forward& f = r.routing->forwards.emplace_back();
    f.layer = o_.layer;
    f.experts.resize(static_cast<size_t>(N) * K);
    r.k.copy_to_host(f.experts.data(), r.kept<int32_t>(p.slot, chosen_), f.experts.size() * sizeof(int32_t));
  }
  route(r, p, /*count_losses=*/output_needed);
  Act* routed = r.kept(p.slot, routed_);
  Act* expert_out = r.kept(p.slot, expert_out_);
  const int32_t* rows = r.kept<int32_t>(p.slot, rows_);
  r.k.moe_dispatch(routed, x, rows, N, K, C);
  if (ep_ > 1) send_to_experts(r, p, routed);
  const ExpertSide e = expert_side(r, p.slot);
  const int local = static_cast<int>(experts_.size());
  r.k.grouped_matmul_forward(e.gate_up, e.x, expert_weights(r, &Expert::gate_up).data(), e.counts->data(), local, C,
                             2 * F_);
  if (e.rows > 0) r.k.swiglu_forward(e.act, e.gate_up, static_cast<int>(e.rows), F_);
  r.k.grouped_matmul_forward(e.out, e.act, expert_weights(r, &Expert::down).data(), e.counts->data(), local, F_, C);
  if (output_needed && r.router != nullptr) {  // once per forward, not when recomputed (summed over dp, pp: not tp)
    r.router->rows_routed += static_cast<double>(N) * K;
    r.router->rows_computed += static_cast<double>(e.rows);
  }
  if (ep_ > 1) exchange(r, p.slot, e.out, expert_out, C, /*towards_experts=*/false);
  zero_dropped_rows(r, p.slot, expert_out);  // combined with weight 0; backward reads them too
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
  Act* expert_out = r.kept(p.slot, expert_out_);
  const int32_t* rows = r.kept<int32_t>(p.slot, rows_);
  const float* weights = r.kept<float>(p.slot, weights_);
  const size_t NK = static_cast<size_t>(N) * K;
  // Through the combination: each routed row's gradient, and each routing weight's (a
  // dot product over the output's columns, of which this rank's experts gave a part).
  r.k.moe_combine_backward(dexpert_out_, dweights_, r.regions.gathered_rows(dout, p.B), expert_out, weights, rows, N,
                           K, C);
  r.tp().sum_routing_weight_gradients(dweights_, NK);
  // The experts' side: the routed rows' gradients go where their experts are.
  const ExpertSide e = expert_side(r, p.slot);
  Act *d_out = dexpert_out_, *d_act = dact_, *d_gate_up = dgate_up_, *d_x = drouted_;
  if (ep_ > 1) {
    d_out = e.out;  // what the experts gave was sent back in forward: their gradients take its place
    d_act = room(r, dact_, kDAct, e.rows, F_);
    d_gate_up = room(r, dgate_up_, kDGateUp, e.rows, 2 * F_);
    d_x = room(r, d_x_, kDX, e.rows, C);
    exchange(r, p.slot, dexpert_out_, d_out, C, /*towards_experts=*/true);
  }
  // Through each expert: down, SwiGLU, gate | up (their weights' gradients later under zb1).
  const int local = static_cast<int>(experts_.size());
  std::vector<float*> d_down, d_gate_up_weights;
  if (!p.defer) d_down = expert_gradients(r, &Expert::down), d_gate_up_weights = expert_gradients(r, &Expert::gate_up);
  r.k.grouped_matmul_backward(d_act, p.defer ? nullptr : d_down.data(), d_out, e.act,
                              expert_weights(r, &Expert::down).data(), e.counts->data(), local, F_, C);
  if (e.rows > 0) r.k.swiglu_backward(d_gate_up, e.gate_up, d_act, static_cast<int>(e.rows), F_);
  if (p.defer) {  // the weight half reads the outputs' gradients where the outputs were
    if (d_out != e.out) r.k.copy_on_device(e.out, d_out, r.k.activation_bytes(e.rows * C));
    r.k.copy_on_device(e.gate_up, d_gate_up, r.k.activation_bytes(e.rows * 2 * F_));
  }
  r.k.grouped_matmul_backward(d_x, p.defer ? nullptr : d_gate_up_weights.data(), d_gate_up, e.x,
                              expert_weights(r, &Expert::gate_up).data(), e.counts->data(), local, C, 2 * F_);
  if (ep_ > 1) exchange(r, p.slot, d_x, drouted_, C, /*towards_experts=*/false);
  zero_dropped_rows(r, p.slot, drouted_);  // no expert's gradient for them
  r.k.moe_dispatch_backward(dinput_, drouted_, rows, N, K, C);
  // The router (replicated, every rank the same: its input's gradient added once, by tp
  // rank 0, before the sum over tp). Its weight's gradient is taken now under zb1 too.
  const bool balanced = o_.aux_loss_coef != 0;
  r.k.moe_router_backward(dlogits_, r.kept<float>(p.slot, probs_), r.kept<float>(p.slot, lse_),
                          r.kept<int32_t>(p.slot, chosen_), weights, dweights_,
                          balanced ? r.kept<float>(p.slot, balance_) + static_cast<size_t>(p.B) * 2 * E : nullptr,
                          r.T, p.loss_scale,
                          static_cast<float>(o_.z_loss_coef) * p.loss_scale, N, E, K, o_.renormalize, o_.sigmoid);
  r.k.matmul_backward(drouter_input_, r.grad(router_), nullptr, dlogits_, r.regions.gathered_rows(in, p.B),
                      r.weight(router_), N, C, E);
  if (r.tp().rank() == 0) r.k.add(dinput_, dinput_, drouter_input_, static_cast<size_t>(N) * C);
  return r.regions.reduce_gradient_rows(dinput_, p.B);
}

void MixtureOfExperts::weight_gradients(LayerRuntime& r, const Pass& p, const Act* /*in*/, Act* /*out*/) {
  const int C = o_.d_model;
  const ExpertSide e = expert_side(r, p.slot);  // out and gate_up hold the gradients backward left there
  const int local = static_cast<int>(experts_.size());
  r.k.grouped_matmul_backward(nullptr, expert_gradients(r, &Expert::down).data(), e.out, e.act, nullptr,
                              e.counts->data(), local, F_, C);
  r.k.grouped_matmul_backward(nullptr, expert_gradients(r, &Expert::gate_up).data(), e.gate_up, e.x, nullptr,
                              e.counts->data(), local, C, 2 * F_);
}

void MixtureOfExperts::update_buffers(LayerRuntime& r, const StepFigures& figures) {
  if (expert_bias_ < 0) return;
  // The step's load of each expert over every rank that routes tokens (summed over the
  // bias's summed_over axes, dp x cp, by the step's reduction): every replica moves alike.
  check(figures.expert_tokens != nullptr && o_.layer < static_cast<int>(figures.expert_tokens->size()),
        "loss-free balancing needs the step's tokens per expert");
  const std::vector<double>& load = (*figures.expert_tokens)[o_.layer];
  const int E = o_.n_experts;
  double mean = 0;
  for (double tokens : load) mean += tokens / E;
  std::vector<float> bias(E);
  float* values = r.buffers + bias_offset_;
  r.k.copy_to_host(bias.data(), values, E * sizeof(float));
  for (int e = 0; e < E; e++) {
    const double error = mean - load[e];  // > 0: under-loaded, its bias rises
    bias[e] += static_cast<float>(o_.bias_update_rate * ((error > 0) - (error < 0)));
  }
  r.k.copy_to_device(values, bias.data(), E * sizeof(float));
}

}  // namespace trident
