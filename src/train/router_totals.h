// What a mixture of experts' routers did in one step, over the whole job: the auxiliary
// losses, the tokens each expert got per layer, the token-expert pairs routed and not
// computed, and the bytes the expert-parallel exchanges sent. The step runner reduces
// them with its loss (one reduction a step); this reads each rank's share and the sums.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace trident {

class RouterTotals {
 public:
  // At the start of a step: the exchanges' bytes so far.
  void start(const Transformer& model) { exchanged_before_ = exchanged_bytes(model); }
  // After the step's backward: this rank's figures, appended to `sums` (which the caller
  // reduces over pp and dp x cp); then read() the reduced ones, from the same place on.
  void append_to(Transformer& model, std::vector<double>& sums);
  void read(Transformer& model, const std::vector<double>& sums, size_t first, int global_batch);

  // The auxiliary losses' mean over the global batch (0 for a dense model).
  double aux_loss() const { return aux_loss_; }
  // Per MoE layer, the most loaded expert's tokens over the mean expert's (1: balanced),
  // and the tokens of each expert (dropped ones too). Empty for a dense model.
  const std::vector<double>& expert_load() const { return expert_load_; }
  const std::vector<std::vector<double>>& expert_tokens() const { return expert_tokens_; }
  // The exchanges' bytes sent by all ranks; the token-expert pairs routed, and those not
  // computed (0: dropless).
  double all_to_all_bytes() const { return all_to_all_bytes_; }
  double tokens_routed() const { return tokens_routed_; }
  double tokens_dropped() const { return tokens_dropped_; }

 private:
  static uint64_t exchanged_bytes(const Transformer& model);  // sent over ep by this rank so far
  uint64_t exchanged_before_ = 0;
  double aux_loss_ = 0, all_to_all_bytes_ = 0, tokens_routed_ = 0, tokens_dropped_ = 0;
  std::vector<double> expert_load_;
  std::vector<std::vector<double>> expert_tokens_;
};

}  // namespace trident
