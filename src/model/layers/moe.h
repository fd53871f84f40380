// A mixture of experts in place of the MLP (Mixtral's sparse MoE block, Qwen3-MoE's,
// Megatron-Core's MoELayer): a router scores the E experts for each token (softmax of
// x W_r^T), the token goes to its K best (their weights: the probabilities, divided by
// their sum when renormalized), each expert is a SwiGLU MLP over the tokens sent to it,
// and the token's output is the weighted sum of its experts' outputs. Dropless: every
// token reaches its K experts (no capacity, nothing dropped).
//
// The tokens are dispatched to rows grouped by expert (one permutation, computed on the
// host from the router's choices), each expert's rows go through its own GEMMs, and the
// rows are combined back per token. Over tp each expert is split as the dense MLP is
// (gate/up by rows, down by columns: Megatron's expert tensor parallelism = tp): the
// router is replicated and sees all rows (gathered under sequence parallelism), the
// partial outputs are summed over tp as a row-parallel layer's.
//
// Auxiliary losses, added to the objective (their gradients) and reported apart:
// - load balancing (Switch Transformer, Mixtral): per sequence s of T tokens,
//   aux_coef * E / (K T^2) * sum_e count(s, e) * sum_t p(t, e), count(s, e) the tokens of
//   s routed to e (a constant), averaged over the batch's sequences; per sequence
//   (DeepSeek-V3's sequence-wise loss) so that it is the same under every layout.
// - the router z-loss (ST-MoE): z_coef * the mean over tokens of logsumexp(logits)^2.
#pragma once

#include <string>
#include <vector>

#include "model/layers/layer.h"

namespace trident {

struct MoeOptions {
  std::string router;   // "<router>.weight" [E, d]
  std::string experts;  // expert e's tensors: "<experts>.<e>.<gate|up|down>.weight"
  std::string gate, up, down;
  int d_model = 0, ffn = 0;  // ffn: each expert's hidden width
  int n_experts = 0, top_k = 0;
  bool renormalize = true;
  double aux_loss_coef = 0, z_loss_coef = 0;
  int seq_len = 0;  // a whole sequence's tokens (the balance is per sequence)
  int layer = 0;    // the block's index in the model (RouterStats::tokens)
};

class MixtureOfExperts : public Sublayer {
 public:
  explicit MixtureOfExperts(MoeOptions o);

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;
  // output_needed false (full recomputation): everything but the combination, and the
  // auxiliary losses are not counted again.
  void forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed = true) override;
  const Act* backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) override;
  void weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) override;

  // Tokens each expert received in the last forward of `slot` (load-balance statistics).
  const std::vector<int>& tokens_per_expert(int slot) const { return counts_.at(slot); }

 private:
  struct Expert {
    int gate_up = -1, down = -1;  // weights: gate | up (adjacent), down
  };
  // The router's choices, on the host: the rows grouped by expert, and the balance loss.
  void route(LayerRuntime& r, const Pass& p, bool count_losses);
  // out = x W^T for each expert's rows (x, out: rows of x_width, out_width elements).
  void expert_gemms(LayerRuntime& r, int slot, const Act* x, int x_width, Act* out, int out_width,
                    int Expert::*weight) const;

  MoeOptions o_;
  int router_ = -1, F_ = 0;  // F_: each expert's hidden columns on this rank
  std::vector<Expert> experts_;
  // Kept per micro-batch (N = B*T rows, all of them under sequence parallelism):
  int logits_ = -1, probs_ = -1, lse_ = -1, chosen_ = -1, weights_ = -1, rows_ = -1, balance_ = -1;
  int routed_ = -1, gate_up_ = -1, act_ = -1, expert_out_ = -1;  // [N*K, d], [N*K, 2F], [N*K, F], [N*K, d]
  // Backward's scratch.
  Act *dinput_ = nullptr, *drouter_input_ = nullptr, *drouted_ = nullptr, *dgate_up_ = nullptr, *dact_ = nullptr,
      *dexpert_out_ = nullptr, *dlogits_ = nullptr;
  float* dweights_ = nullptr;
  std::vector<std::vector<int>> counts_;  // per slot: tokens per expert (the rows' groups)
  std::vector<int32_t> host_chosen_, host_rows_;
  std::vector<float> host_probs_, host_lse_, host_stats_;
};

}  // namespace trident
