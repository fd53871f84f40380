// Qwen3-MoE (Qwen team 2025; Hugging Face's Qwen3MoeForCausalLM): a Qwen3 (q/k norms per
// head) whose MLPs are mixtures of experts (mlp.gate, mlp.experts.{e}.gate_proj, up_proj,
// down_proj, each moe_ffn_dim wide), in every layer; the top-k weights renormalized when
// norm_topk_prob (model.moe_norm_topk).
#include "model/families/llama_style.h"

namespace trident {

namespace {

HfConventions conventions() {
  HfConventions hf = llama_style_hf(
      {{"architectures", {"Qwen3MoeForCausalLM"}},
       {"model_type", "qwen3_moe"},
       {"hidden_act", "silu"},
       {"attention_bias", false},
       {"use_sliding_window", false},
       {"attention_dropout", 0.0},
       {"decoder_sparse_step", 1},
       {"mlp_only_layers", nlohmann::ordered_json::array()},
       {"output_router_logits", false}},
      {.vocab = 151936, .hidden = 2048, .intermediate = 6144, .layers = 24, .heads = 32, .max_positions = 32768},
      {{.key = "n_experts", .hf = "num_experts", .required = true},
       {.key = "n_experts_per_token", .hf = "num_experts_per_tok", .hf_default = 8},
       {.key = "moe_ffn_dim", .hf = "moe_intermediate_size", .hf_default = 768},
       {.key = "moe_norm_topk", .hf = "norm_topk_prob", .hf_default = 0},
       {.key = "router_aux_loss_coef", .hf = "router_aux_loss_coef", .hf_default = 0.001, .checked = false}});
  const auto llama_check = hf.check;
  hf.check = [llama_check](const nlohmann::json& c, const TransformerSpec& s, std::vector<std::string>& out) {
    llama_check(c, s, out);
    // Every layer sparse here: no dense MLP layers between them.
    if (c.value("decoder_sparse_step", 1) != 1) out.push_back("decoder_sparse_step is not 1: every layer is sparse here");
    if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].empty())
      out.push_back("mlp_only_layers is not empty: every layer is a mixture of experts here");
  };
  return hf;
}

const bool registered = register_family(llama_style({
    .name = "qwen3_moe",
    .qk_norm = QkNormKind::per_head,
    .experts = LlamaStyleExperts{.block = "mlp", .gate = "gate_proj", .up = "up_proj", .down = "down_proj",
                                  .default_experts = 128, .default_top_k = 8},
    .hf = conventions(),
}));

}  // namespace

}  // namespace trident
