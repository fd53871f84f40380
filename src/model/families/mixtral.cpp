// Mixtral (Jiang et al. 2024; Hugging Face's MixtralForCausalLM): a Mistral whose MLPs are
// mixtures of experts (block_sparse_moe: a router `gate` and experts w1 (gate), w3 (up),
// w2 (down), each ffn_dim wide), top-k routing renormalized over the chosen experts.
#include "model/families/llama_style.h"

namespace trident {

namespace {

const LlamaHfDefaults kDefaults = {.vocab = 32000, .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
                                   .max_positions = 131072, .rms_norm_eps = 1e-5, .rope_theta = 1e6};

const bool registered = register_family(llama_style({
    .name = "mixtral",
    .sliding_window = true,
    .experts = LlamaStyleExperts{.block = "block_sparse_moe", .gate = "w1", .up = "w3", .down = "w2", .default_experts = 8,
                .width_is_ffn_dim = true, .renormalize_option = false},
    .hf = llama_style_hf({{"architectures", {"MixtralForCausalLM"}},
                         {"model_type", "mixtral"},
                         {"hidden_act", "silu"},
                         {"attention_dropout", 0.0},
                         {"output_router_logits", false},
                         {"router_jitter_noise", 0.0}},
                         kDefaults,
                         {{.key = "sliding_window", .hf = "sliding_window", .hf_default = 0, .null_is_zero = true},
                          {.key = "n_experts", .hf = "num_local_experts", .required = true},
                          {.key = "n_experts_per_token", .hf = "num_experts_per_tok", .hf_default = 2},
                          {.key = "router_aux_loss_coef", .hf = "router_aux_loss_coef", .hf_default = 0.001,
                           .checked = false}}),
}));

}  // namespace

}  // namespace trident
