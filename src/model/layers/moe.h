// A mixture of experts in place of the MLP (Mixtral's sparse MoE block, Qwen3-MoE's,
// Megatron-Core's MoELayer): a router scores the E experts for each token (softmax of
// x W_r^T), the token goes to its K best (their weights: the probabilities, divided by
// their sum when renormalized), each expert is a SwiGLU MLP over the tokens sent to it,
// and the token's output is the weighted sum of its experts' outputs. Dropless by default:
// every token reaches its K experts. With a capacity factor f (Megatron's
// moe_expert_capacity_factor, per sequence here, so that every layout drops the same
// tokens), an expert takes at most ceil(f T K / E) of a sequence's T tokens: those over it
// (the lowest routing weights, or the latest tokens) are dropped, their weights made 0 after the
// renormalization, so the token's output lacks that expert. The balance loss counts the
// routing before the drops.
//
// The tokens are dispatched to rows grouped by expert (one permutation, computed on the
// device from the router's choices: only the row counts per expert go to the host, which
// the grouped GEMMs need there; with a capacity factor the drops are decided on the
// host), each expert's rows go through its own GEMMs, and the
// rows are combined back per token. Over tp each expert is split as the dense MLP is
// (gate/up by rows, down by columns: Megatron's expert tensor parallelism = tp): the
// router is replicated and sees all rows (gathered under sequence parallelism), the
// partial outputs are summed over tp as a row-parallel layer's.
//
// Expert parallelism (parallel.ep): this rank holds E / ep of the experts; the rows of
// its tokens grouped by expert are sent to the ranks holding their experts and the
// experts' outputs come back (all-to-all over the ep group, twice forward and twice
// backward), as Megatron-Core's all-to-all token dispatcher. The rows received are
// regrouped by local expert (one permutation) for the GEMMs and put back in arrival order
// for the return. Their number depends on the routing: the arena holds a balanced share
// (dropless) or the bound a capacity factor sets; a dropless layer's rows beyond its share
// go to buffers grown as needed (layer.h's GrowingScratch), per layer and slot.
//
// Auxiliary losses, added to the objective (their gradients) and reported apart:
// - load balancing (Switch Transformer, Mixtral): per sequence s of T tokens,
//   aux_coef * E / (K T^2) * sum_e count(s, e) * sum_t p(t, e), count(s, e) the tokens of
//   s routed to e (a constant), averaged over the batch's sequences; per sequence
//   (DeepSeek-V3's sequence-wise loss) so that it is the same under every layout.
// - the router z-loss (ST-MoE): z_coef * the mean over tokens of logsumexp(logits)^2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/device_buffer.h"
#include "model/layers/layer.h"

namespace trident {

struct MoeOptions {
  std::string router;   // "<router>.weight" [E, d]
  std::string experts;  // expert e's tensors: "<experts>.<e>.<gate|up|down>.weight"
  std::string gate, up, down;
  int d_model = 0, ffn = 0;  // ffn: each expert's hidden width
  int n_experts = 0, top_k = 0;
  bool renormalize = true;
  bool sigmoid = false;  // scores: sigmoid(logits) (the balance loss on their normalized values), not softmax
  double capacity_factor = 0;     // 0: dropless
  double dropless_headroom = 1;   // dropless under ep: the received rows held, in balanced shares
  bool drop_by_position = false;  // over capacity: the latest tokens dropped, else the lowest weights
  double aux_loss_coef = 0, z_loss_coef = 0;
  // Loss-free balancing (DeepSeek-V3's, Megatron's moe_router_bias_update_rate; 0: off): a
  // per-expert bias added to the scores for the choice only, moved after each step by this
  // rate times the sign of (the mean expert's load - the expert's).
  double bias_update_rate = 0;
  int seq_len = 0;  // a whole sequence's tokens (the balance is per sequence)
  int layer = 0;    // the block's index in the model (RouterStats::tokens)
};

// The largest upload() a mixture makes in a step, in bytes, for N tokens with K experts
// each: the rows permutation (N K ints) or, under expert parallelism over ep ranks, the
// order of the rows received, up to N K from each rank (dropless, all to this rank's
// experts). Kernels::reserve_uploads() sizes the staging for it up front.
// Dropless under expert parallelism a rank's experts receive as many rows as the routing
// sends them: the activations hold model.moe_dropless_headroom times the balanced share
// (as many as the rank sends), rows beyond it are held as routed (a warning at the end).
// The memory plan's words for it: ", experts' rows received at 2.00x the balanced share",
// or "" where it does not apply.
std::string dropless_rows_held(const TransformerSpec& spec, int ep, const ModelConfig& model);

inline size_t moe_largest_upload_bytes(size_t N, int K, int ep) {
  return N * static_cast<size_t>(K) * static_cast<size_t>(ep < 1 ? 1 : ep) * sizeof(int32_t);
}

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
  // Loss-free balancing: the expert bias moved by the step's load of this layer's experts.
  void update_buffers(LayerRuntime& r, const StepFigures& figures) override;

  // Tokens each expert received in the last forward of `slot` (load-balance statistics).
  const std::vector<int>& tokens_per_expert(int slot) const { return counts_.at(slot); }

 private:
  struct Expert {
    int gate_up = -1, down = -1;  // weights: gate | up (adjacent), down
  };
  // This rank's experts' side of a micro-batch: their rows (grouped by local expert), the
  // GEMMs' outputs, and the rows per local expert. Without expert parallelism the
  // routed rows themselves, in the arena; with it, what the exchange brought.
  struct ExpertSide {
    Act *x = nullptr, *gate_up = nullptr, *act = nullptr, *out = nullptr;
    const std::vector<int>* counts = nullptr;
    size_t rows = 0;
  };
  // Expert parallelism, per slot: the rows sent to and received from each ep rank, the
  // permutation from arrival order to grouped by local expert. The received rows are in
  // the arena up to expert_rows_, else (dropless) in the stage's GrowingScratch.
  struct Exchange {
    std::vector<size_t> sent, received;  // rows, per ep rank
    std::vector<int> local_counts;       // rows per local expert
    size_t rows = 0;                     // received in all
  };
  // The router's choices to rows grouped by expert (the dropped ones after all of them),
  // the experts' row counts on the host, and (count_losses) the balance loss.
  void route(LayerRuntime& r, const Pass& p, bool count_losses);
  // Dropless: the permutation on the device; the counts (every ep rank's) read once.
  void route_dropless(LayerRuntime& r, const Pass& p, bool recomputing);
  // With a capacity factor: the choices read, the drops decided and the rows made on the host.
  void route_with_capacity(LayerRuntime& r, const Pass& p);
  // The balance loss's statistics, coefficients and value (into RouterStats' device sum).
  void count_balance(LayerRuntime& r, const Pass& p);
  // The capacity: which of the micro-batch's (token, expert) pairs are over it (host_dropped_),
  // their weights made 0. Under context parallelism a sequence's pairs are on every cp
  // rank: each gathers all of them and decides the same.
  void drop_over_capacity(LayerRuntime& r, const Pass& p);
  // `values` (each rank's part in place, at its rank) completed from every rank of `group`,
  // through device memory (NCCL's).
  void all_gather_host(LayerRuntime& r, Communicator& group, std::vector<float>& values);
  // The dropped pairs' rows of a [N K, d] block (after the kept ones) set to 0.
  void zero_dropped_rows(LayerRuntime& r, int slot, Act* rows) const;
  ExpertSide expert_side(LayerRuntime& r, int slot);
  // Expert parallelism: the counts of every ep rank's rows for every expert, what this rank
  // sends and receives, the buffers sized, then the routed rows to their experts' ranks
  // (into ExpertSide::x, grouped by local expert).
  void send_to_experts(LayerRuntime& r, const Pass& p, const Act* routed);
  // An [rows of width] block of expert-side rows back to (or from, `towards_experts`) the
  // ranks whose tokens they are, through the exchange buffer and the slot's permutation.
  void exchange(LayerRuntime& r, int slot, const Act* from, Act* to, int width, bool towards_experts);
  // out = x W^T for each local expert's rows (x, out: rows of x_width, out_width elements).
  // The local experts' weights `which`, and where their gradients go, for the grouped GEMMs.
  std::vector<const Act*> expert_weights(LayerRuntime& r, int Expert::*which) const;
  std::vector<float*> expert_gradients(LayerRuntime& r, int Expert::*which) const;

  MoeOptions o_;
  int router_ = -1, F_ = 0;  // F_: each expert's hidden columns on this rank
  int expert_bias_ = -1;     // the buffer (loss-free balancing; -1: none), at bias_offset_
  size_t bias_offset_ = 0;
  const float* expert_bias(const LayerRuntime& r) const { return expert_bias_ >= 0 ? r.buffers + bias_offset_ : nullptr; }
  int ep_ = 1, first_expert_ = 0;  // expert parallelism: this rank's experts start at first_expert_
  std::vector<Expert> experts_;    // this rank's: E / ep of them
  std::vector<Exchange> exchanges_;  // per slot (ep > 1)
  // The rows the arena holds for the received ones (ep > 1): dropless, the headroom times
  // N K (as many as this rank sends: balanced routing), the bound a capacity factor sets otherwise.
  size_t received_rows_held(int sequences, size_t N) const;
  size_t capacity_per_sequence() const;  // ceil(factor T K / E): an expert's pairs of a sequence at most
  // The rows the arena holds for the expert side: its own tokens' N K, or under ep those
  // received (received_rows_held).
  size_t expert_rows_ = 0;
  int order_ = -1, received_ = -1, received_out_ = -1;  // kept (ep > 1): [capacity], [capacity, d] twice
  // Expert parallelism's scratch: in the arena up to expert_rows_, beyond (dropless) in
  // the stage's GrowingScratch.
  Act *transfer_ = nullptr, *d_x_ = nullptr;  // and dact_, dgate_up_
  // What GrowingScratch holds beyond expert_rows_: the stage's scratch, and per slot this
  // layer's kept rows (the received rows, their order, and the expert side's activations).
  enum Beyond { kTransfer, kDAct, kDGateUp, kDX, kOrder, kX, kGateUp, kAct, kOut };
  // `declared` (rows of width) when the rows fit the arena, else the stage's buffer `which`.
  Act* room(LayerRuntime& r, Act* declared, Beyond which, size_t rows, size_t width) const;
  // Slot `slot`'s buffer `which` of this layer beyond the arena, of `elements` activations.
  Act* kept_beyond(LayerRuntime& r, int slot, Beyond which, size_t elements) const;
  const int32_t* order(LayerRuntime& r, int slot);
  // Kept per micro-batch (N = B*T rows, all of them under sequence parallelism):
  int logits_ = -1, probs_ = -1, lse_ = -1, chosen_ = -1, weights_ = -1, rows_ = -1, balance_ = -1;
  int routed_ = -1, gate_up_ = -1, act_ = -1, expert_out_ = -1;  // [N*K, d], [N*K, 2F], [N*K, F], [N*K, d]
  // Backward's scratch.
  Act *dinput_ = nullptr, *drouter_input_ = nullptr, *drouted_ = nullptr, *dgate_up_ = nullptr, *dact_ = nullptr,
      *dexpert_out_ = nullptr, *dlogits_ = nullptr;
  float* dweights_ = nullptr;
  std::vector<std::vector<int>> counts_;  // per slot: tokens per expert (the rows' groups), the dropped not counted
  struct SlotRows {
    size_t routed = 0, kept = 0;  // N K, and those that reach an expert (all when dropless)
  };
  std::vector<SlotRows> slot_rows_;
  std::vector<int32_t> host_chosen_, host_rows_;
  std::vector<char> host_dropped_;  // per (token, k): over its expert's capacity
  std::vector<float> host_weights_, host_pairs_;
  kernels::DeviceBuffer gathered_;  // all_gather_host's
  // Per slot: every ep rank's rows per expert ([ep, E]; this rank's alone without ep), as
  // route() read them. Their device scratch; the sigmoid router's per-token score sums.
  std::vector<std::vector<float>> every_ranks_counts_;
  float *counts_device_ = nullptr, *token_totals_ = nullptr;
};

}  // namespace trident
