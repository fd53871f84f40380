// Self-attention, Megatron-style over tp (heads split), in slots: a column-parallel
// projection to q | k | v; q and k normalized (if the family does: each head's, Qwen3;
// the whole width's, OLMo-2: the q/k norm slot, qk_norm.h); the position slot, rotary
// positions on q and k (if the family has them: rotary.h); the core, flash-style kernels
// or context parallelism's ring (model/context_parallel.h) under the layer's mask
// (causal, within documents, within its sliding window); and a row-parallel output
// projection. What the position and core slots read besides the layer's own tensors (its
// rotary table, ring and masks) it takes, when the stage is built, from the stage's
// attention context (attention_context.h), shared with the layers of the same settings.
// Grouped-query attention: n_kv_head key/value heads, each serving n_head / n_kv_head
// query heads; when tp exceeds the key/value heads, consecutive ranks share one (their
// parts of its gradient summed after backward).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/context_parallel.h"
#include "model/layers/attention_context.h"
#include "model/layers/qk_norm.h"
#include "model/layers/parallel_linear.h"
#include "model/layers/rotary.h"

namespace trident {

struct AttentionOptions {
  // The projection's tensors: one fused [3 H hd, d] (GPT-2's c_attn, rows cut within each
  // of q, k and v), or q [H hd, d], k and v [KV hd, d] apart (Llama's); + ".weight".
  std::vector<std::string> qkv;
  std::string out;  // the output projection [d, H hd]
  int d_model = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  bool qkv_bias = false;  // biases on the q, k, v projection (GPT-2, Qwen2)
  bool out_bias = false;  // a bias on the output projection (GPT-2)
  std::optional<RotarySettings> rotary = {};  // the position slot: rotary positions on q and k (none: no rotation)
  int window = 0;  // sliding window (Mistral): each query sees the latest `window` keys, itself included; 0: all
  // q and k RMS-normalized before the rotary embedding, by the gains "<q_norm>" and
  // "<k_norm>" (+ ".weight") with norm_eps: each head's (Qwen3) or the whole width's (OLMo-2).
  QkNormKind qk_norm = QkNormKind::none;
  std::string q_norm = {}, k_norm = {};
  double norm_eps = 1e-6;
};

class Attention : public Sublayer {
 public:
  explicit Attention(AttentionOptions o);

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;
  void forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed = true) override;
  const Act* backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) override;
  void weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) override;
  void recompute_selective(LayerRuntime& r, const Pass& p) override { core_forward(r, p); }
  // Its rotary table, ring and masks, from the stage's context (after declare_parameters:
  // the ring is this rank's heads').
  void attach(AttentionContext& context) override;

 private:
  // atty and its row statistics from the slot's qkv (the sequence's own keys, or the ring's).
  void core_forward(LayerRuntime& r, const Pass& p) const;
  AttentionOptions o_;
  ColumnParallelLinear qkv_;
  RowParallelLinear out_;
  std::unique_ptr<QkNorm> q_norm_, k_norm_;  // the q/k norm slot (null: none)
  int heads_local_ = 0, kv_heads_local_ = 0;  // this rank's query and key/value heads
  int qkv_buffer_ = -1, atty_buffer_ = -1, stats_buffer_ = -1;  // kept: q | k | v, the core's output and statistics
  Act *datty_ = nullptr, *dqkv_ = nullptr, *dinput_ = nullptr;  // backward's scratch
  // Shared with the stage's other attention layers (attention_context.h): the rotary
  // table of this rank's positions (null: no rotation), the ring (null: the local kernels),
  // the masks of this layer's window.
  const float* rotary_table_ = nullptr;
  RingAttention* ring_ = nullptr;
  const SlotMasks* masks_ = nullptr;
  RingBuffers ring_buffers_;  // the ring's scratch, in the arena
};

}  // namespace trident
