// The Llama-style families: rotary positions, RMSNorm, SwiGLU, grouped-query attention, no
// biases but where a family adds them, a head of its own or tied to the token table
// (model.tie_word_embeddings), heads model.head_dim wide, Hugging Face's Llama names
// (model.layers.{i}.self_attn.q_proj, ...). Llama, Qwen2, Qwen3, Mistral, Mixtral,
// Qwen3-MoE and OLMo-2 are each one of these (its file: llama.cpp, qwen2.cpp, ...) with its options
// and its config.json.
#pragma once

#include <optional>

#include "model/families/family.h"
#include "model/layers/qk_norm.h"

namespace trident {

// A mixture of experts in place of each block's MLP (model/layers/moe.h), with its
// Hugging Face names: model.layers.{i}.<block>.gate (the router), <block>.experts.{e}.<gate|up|down>.
struct LlamaStyleExperts {
  std::string block;             // "block_sparse_moe" (Mixtral), "mlp" (Qwen3-MoE)
  std::string gate, up, down;    // "w1", "w3", "w2" (Mixtral); "gate_proj", ... (Qwen3-MoE)
  int default_experts = 8;       // when model.n_experts is 0
  int default_top_k = 2;         // when model.n_experts_per_token is 0 (Hugging Face's default)
  bool width_is_ffn_dim = false;  // each expert is ffn_dim wide (Mixtral: intermediate_size); else moe_ffn_dim
  bool renormalize_option = true;  // model.moe_norm_topk may be false (Qwen3-MoE); Mixtral always renormalizes
};

struct LlamaStyle {
  std::string name;             // model.family
  bool qkv_bias = false;        // biases on q, k and v (Qwen2)
  // q and k RMS-normalized before the rotary embedding: each head's (Qwen3), or over the
  // whole projection (OLMo-2).
  QkNormKind qk_norm = QkNormKind::none;
  // Post-norm branches, x + norm(sublayer(x)) with no norm before (OLMo-2): the attention's
  // post_attention_layernorm, the MLP's post_feedforward_layernorm.
  bool post_norm = false;
  bool sliding_window = false;  // model.sliding_window applies (Mistral)
  std::optional<LlamaStyleExperts> experts = std::nullopt;  // experts in place of the MLP (Mixtral, Qwen3-MoE)
  HfConventions hf;             // its config.json: fixed fields, its fields and HF's defaults for them
};
ModelFamily llama_style(LlamaStyle style);

// HF's defaults of a Llama-style config.json (each architecture's own).
struct LlamaHfDefaults {
  double vocab, hidden, intermediate, layers, heads, max_positions, rms_norm_eps = 1e-6, rope_theta = 10000;
};
// The config.json fields of the config's keys for a Llama-style family.
std::vector<HfField> llama_hf_fields(const LlamaHfDefaults& d);
// A Llama-style family's Hugging Face conventions: its fixed fields (architectures,
// model_type, ...), the fields above (and `extra` ones), rope_scaling, head_dim, tie_word_embeddings.
HfConventions llama_style_hf(nlohmann::ordered_json constants, const LlamaHfDefaults& d,
                             std::vector<HfField> extra = {});

}  // namespace trident
