#include "train/router_totals.h"

#include <algorithm>
#include <numeric>

namespace trident {

namespace {
// The order of a step's figures in `sums`: the tokens per layer and expert last.
enum At { aux_loss, routed, not_computed, exchanged, tokens };
}  // namespace

uint64_t RouterTotals::exchanged_bytes(const Transformer& model) {
  const Communicator* ep = model.expert_parallel();
  return ep == nullptr ? 0 : ep->stats().bytes[static_cast<int>(CommOp::all_to_all)];
}

void RouterTotals::append_to(Transformer& model, std::vector<double>& sums) {
  const RouterStats router = model.take_router_stats();
  const uint64_t exchanged = exchanged_bytes(model) - exchanged_before_;
  sums.insert(sums.end(), {router.aux_loss_sum, router.rows_routed, router.rows_routed - router.rows_computed,
                           static_cast<double>(exchanged)});
  sums.insert(sums.end(), router.tokens.begin(), router.tokens.end());
}

void RouterTotals::read(Transformer& model, const std::vector<double>& sums, size_t first, int global_batch) {
  const auto at = [&](size_t i) { return sums[first + i]; };
  aux_loss_ = at(At::aux_loss) / global_batch;
  tokens_routed_ = at(At::routed);
  tokens_dropped_ = at(At::not_computed);
  // Summed over pp and dp x cp; every tp rank exchanges as many.
  const Communicator* tp = model.tensor_parallel().communicator();
  all_to_all_bytes_ = at(At::exchanged) * (tp != nullptr ? tp->size() : 1);
  const int E = model.spec().n_experts;
  expert_load_.clear();
  expert_tokens_.clear();
  for (size_t layer = first + At::tokens; E > 0 && layer < sums.size(); layer += E) {
    const auto begin = sums.begin() + static_cast<std::ptrdiff_t>(layer), end = begin + E;
    const double total = std::accumulate(begin, end, 0.0);
    expert_load_.push_back(total > 0 ? *std::max_element(begin, end) * E / total : 1.0);
    expert_tokens_.emplace_back(begin, end);
  }
}

}  // namespace trident
