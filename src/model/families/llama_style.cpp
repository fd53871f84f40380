#include "model/families/llama_style.h"

#include "kernels/base/error.h"
#include "model/layers/attention.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"

namespace trident {

namespace {

std::string key_value(const char* key, int value) { return std::string(key) + " (" + std::to_string(value) + ")"; }

// The MLP width when none is given: 2/3 of 4d, rounded up to a multiple of 256 (Meta's
// ModelArgs with multiple_of = 256).
int default_ffn(int d) { return (8 * d / 3 + 255) / 256 * 256; }

void configure_experts(const LlamaStyle& style, const ModelConfig& c, TransformerSpec& s) {
  const LlamaStyleExperts& x = *style.experts;
  s.n_experts = c.n_experts > 0 ? c.n_experts : x.default_experts;
  s.experts_per_token = c.n_experts_per_token != 0 ? c.n_experts_per_token : x.default_top_k;
  require(s.n_experts <= 512, key_value("model.n_experts", s.n_experts) + " must be at most 512");
  require(s.experts_per_token >= 1 && s.experts_per_token <= s.n_experts,
          key_value("model.n_experts_per_token", s.experts_per_token) + " must be between 1 and " +
              key_value("model.n_experts", s.n_experts) + ": each token goes to that many different experts");
  if (x.width_is_ffn_dim) {
    require(c.moe_ffn_dim == 0 || c.moe_ffn_dim == s.ffn_dim,
            "model.moe_ffn_dim: " + style.name + "'s experts are model.ffn_dim wide (leave moe_ffn_dim 0)");
    s.moe_ffn_dim = s.ffn_dim;
  } else {
    s.moe_ffn_dim = c.moe_ffn_dim > 0 ? c.moe_ffn_dim : s.ffn_dim;
  }
  require(x.renormalize_option || c.moe_norm_topk,
          "model.moe_norm_topk = false: " + style.name + " always divides the top-k weights by their sum");
  require(c.moe_router_score == "softmax" || c.moe_router_score == "sigmoid",
          "model.moe_router_score must be softmax or sigmoid, got '" + c.moe_router_score + "'");
  require(c.moe_router_bias_update_rate >= 0, "model.moe_router_bias_update_rate (" +
                                                 std::to_string(c.moe_router_bias_update_rate) +
                                                 ") must not be negative (0: off)");
  require(c.moe_capacity_factor >= 0, "model.moe_capacity_factor (" + std::to_string(c.moe_capacity_factor) +
                                         ") must not be negative (0: dropless)");
  require(c.moe_dropless_headroom >= 1, "model.moe_dropless_headroom (" + std::to_string(c.moe_dropless_headroom) +
                                          ") must be at least 1 (the balanced share)");
  require(c.moe_token_drop_policy == "probs" || c.moe_token_drop_policy == "position",
          "model.moe_token_drop_policy must be probs or position, got '" + c.moe_token_drop_policy + "'");
  require(c.router_aux_loss_coef >= 0 && c.router_z_loss_coef >= 0,
          "model.router_aux_loss_coef and model.router_z_loss_coef must not be negative");
}

void configure(const LlamaStyle& style, const ModelConfig& c, TransformerSpec& s) {
  require(s.n_kv_head <= s.n_head && s.n_head % s.n_kv_head == 0,
          key_value("model.n_kv_head", c.n_kv_head) + " must divide " + key_value("model.n_head", c.n_head) +
              ": each key/value head serves a group of query heads");
  require(s.head_dim % 2 == 0, "rotary embeddings turn pairs of channels: the head dimension (model.head_dim, or "
                               "model.d_model / model.n_head: " + std::to_string(s.head_dim) + ") must be even");
  require(c.rope_theta > 0, "model.rope_theta must be positive");
  require(c.rope_scaling.type == "none" || c.rope_scaling.type == "llama3",
          "model.rope_scaling must be none or llama3, got '" + c.rope_scaling.type + "'");
  if (c.rope_scaling.type == "llama3")
    require(c.rope_scaling.factor >= 1 && c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor &&
                c.rope_scaling.low_freq_factor > 0 && c.rope_scaling.original_max_position > 0,
            "model.rope_scaling = llama3 needs rope_factor >= 1, rope_high_freq_factor > rope_low_freq_factor > 0 "
            "and rope_original_max_position > 0");
  require(style.sliding_window || c.sliding_window == 0,
          "model.sliding_window applies to model.family = mistral, not " + style.name);
  s.ffn_dim = c.ffn_dim > 0 ? c.ffn_dim : default_ffn(c.d_model);
  if (style.experts) configure_experts(style, c, s);
  s.positions = PositionKind::rotary;
  s.mlp = MlpKind::swiglu;
  s.tied_head = c.tie_word_embeddings;
}

std::unique_ptr<Norm> rmsnorm(const TransformerSpec& s, const std::string& name) {
  return std::make_unique<Norm>(NormKind::rmsnorm, name, s.d_model, s.norm_eps);
}

std::unique_ptr<Block> block(const LlamaStyle& style, const TransformerSpec& s, int layer) {
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  // Each branch's norms: pre-norm (input_layernorm, post_attention_layernorm), or post-norm
  // (post_attention_layernorm, post_feedforward_layernorm: OLMo-2).
  const auto pre_norm = [&](const char* name) { return style.post_norm ? nullptr : rmsnorm(s, l + name); };
  const auto post_norm = [&](const char* name) { return style.post_norm ? rmsnorm(s, l + name) : nullptr; };
  const bool qk_norm = style.qk_norm != QkNormKind::none;
  auto b = std::make_unique<Block>(s.d_model);
  b->add_branch(pre_norm("input_layernorm"),
                std::make_unique<Attention>(AttentionOptions{
                    .qkv = {l + "self_attn.q_proj", l + "self_attn.k_proj", l + "self_attn.v_proj"},
                    .out = l + "self_attn.o_proj",
                    .d_model = s.d_model,
                    .n_head = s.n_head,
                    .n_kv_head = s.n_kv_head,
                    .head_dim = s.head_dim,
                    .qkv_bias = style.qkv_bias,
                    .rotary = s.rotary(),
                    .window = s.sliding_window,
                    .qk_norm = style.qk_norm,
                    .q_norm = qk_norm ? l + "self_attn.q_norm" : "",
                    .k_norm = qk_norm ? l + "self_attn.k_norm" : "",
                    .norm_eps = s.norm_eps}),
                post_norm("post_attention_layernorm"));
  if (style.experts) {
    const LlamaStyleExperts& x = *style.experts;
    const ModelConfig& c = s.config;
    b->add_branch(pre_norm("post_attention_layernorm"),
                  std::make_unique<MixtureOfExperts>(MoeOptions{.router = l + x.block + ".gate",
                                                                .experts = l + x.block + ".experts",
                                                                .gate = x.gate,
                                                                .up = x.up,
                                                                .down = x.down,
                                                                .d_model = s.d_model,
                                                                .ffn = s.moe_ffn_dim,
                                                                .n_experts = s.n_experts,
                                                                .top_k = s.experts_per_token,
                                                                .renormalize = c.moe_norm_topk,
                                                                .sigmoid = c.moe_router_score == "sigmoid",
                                                                .capacity_factor = c.moe_capacity_factor,
                                                                .dropless_headroom = c.moe_dropless_headroom,
                                                                .drop_by_position =
                                                                    c.moe_token_drop_policy == "position",
                                                                .aux_loss_coef = c.router_aux_loss_coef,
                                                                .z_loss_coef = c.router_z_loss_coef,
                                                                .bias_update_rate = c.moe_router_bias_update_rate,
                                                                .seq_len = s.seq_len,
                                                                .layer = layer}),
                  post_norm("post_feedforward_layernorm"));
    return b;
  }
  b->add_branch(pre_norm("post_attention_layernorm"),
                std::make_unique<Mlp>(MlpOptions{.activation = MlpKind::swiglu,
                                                 .in = {l + "mlp.gate_proj", l + "mlp.up_proj"},
                                                 .out = l + "mlp.down_proj",
                                                 .d_model = s.d_model,
                                                 .ffn = s.ffn_dim,
                                                 .bias = false}),
                post_norm("post_feedforward_layernorm"));
  return b;
}

}  // namespace

ModelFamily llama_style(LlamaStyle style) {
  ModelFamily f;
  f.name = style.name;
  f.hf = style.hf;
  f.configure = [style](const ModelConfig& c, TransformerSpec& s) { configure(style, c, s); };
  f.embedding = [](const TransformerSpec& s, bool table_only) {
    return std::make_unique<Embedding>(EmbeddingOptions{.tokens = "model.embed_tokens.weight",
                                                        .positions = "",  // rotary: attention's
                                                        .vocab = s.vocab_size,
                                                        .d_model = s.d_model,
                                                        .seq_len = s.seq_len,
                                                        .tied = s.tied_head,
                                                        .table_only = table_only});
  };
  f.block = [style](const TransformerSpec& s, int layer) { return block(style, s, layer); };
  f.final_norm = [](const TransformerSpec& s) { return rmsnorm(s, "model.norm"); };
  f.head = [](const TransformerSpec& s) {
    // Tied (tie_word_embeddings): the token table is the head's weight; HF stores no lm_head.
    return std::make_unique<Head>(HeadOptions{.table = s.tied_head ? "model.embed_tokens.weight" : "lm_head.weight",
                                              .vocab = s.vocab_size, .d_model = s.d_model, .tied = s.tied_head});
  };
  return f;
}

std::vector<HfField> llama_hf_fields(const LlamaHfDefaults& d) {
  return {{"n_layer", "num_hidden_layers", d.layers},
          {"n_head", "num_attention_heads", d.heads},
          {"n_kv_head", "num_key_value_heads", 0, "num_attention_heads"},
          {"d_model", "hidden_size", d.hidden},
          {"ffn_dim", "intermediate_size", d.intermediate},
          {"seq_len", "max_position_embeddings", d.max_positions, nullptr, 1, /*checked=*/false},
          {"vocab_size", "vocab_size", d.vocab},
          {"tie_word_embeddings", "tie_word_embeddings", 0},
          {"norm_eps", "rms_norm_eps", d.rms_norm_eps},
          {"rope_theta", "rope_theta", d.rope_theta}};
}

HfConventions llama_style_hf(nlohmann::ordered_json constants, const LlamaHfDefaults& d, std::vector<HfField> extra) {
  HfConventions hf;
  hf.constants = std::move(constants);
  hf.fields = llama_hf_fields(d);
  hf.fields.insert(hf.fields.end(), extra.begin(), extra.end());
  hf.rope_scaling = true;
  hf.finish = [](const TransformerSpec& s, nlohmann::ordered_json& c) { c["head_dim"] = s.head_dim; };
  // head_dim: HF's default (absent or null) is hidden_size / num_attention_heads.
  hf.check = [](const nlohmann::json& c, const TransformerSpec& s, std::vector<std::string>& out) {
    if (c.contains("head_dim") && c["head_dim"].is_number() && c["head_dim"].get<double>() != s.head_dim)
      out.push_back("head_dim = " + std::to_string(c["head_dim"].get<int>()) + ", but model.head_dim = " +
                    std::to_string(s.head_dim));
    if ((!c.contains("head_dim") || c["head_dim"].is_null()) && s.head_dim * s.n_head != s.d_model)
      out.push_back("head_dim is left out (hidden_size / num_attention_heads = " + std::to_string(s.d_model / s.n_head) +
                    "), but model.head_dim = " + std::to_string(s.head_dim));
  };
  return hf;
}

}  // namespace trident
