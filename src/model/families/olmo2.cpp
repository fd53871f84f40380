// OLMo 2 (Team OLMo 2024; Hugging Face's Olmo2ForCausalLM): a Llama whose blocks are
// post-norm, x + norm(sublayer(x)) with no norm before the sublayer, and whose attention
// RMS-normalizes q and k over the whole projection (q_norm [n_head hd], k_norm
// [n_kv_head hd]) before the split into heads and the rotary embedding; no biases.
#include "model/families/llama_style.h"

namespace trident {

namespace {

const bool registered = register_family(llama_style({
    .name = "olmo2",
    .qk_norm = QkNormKind::full_width,
    .post_norm = true,
    .hf = llama_style_hf({{"architectures", {"Olmo2ForCausalLM"}},
                         {"model_type", "olmo2"},
                         {"hidden_act", "silu"},
                         {"attention_bias", false},
                         {"attention_dropout", 0.0}},
                         {.vocab = 50304, .hidden = 4096, .intermediate = 11008, .layers = 32, .heads = 32,
                          .max_positions = 2048, .rms_norm_eps = 1e-5}),
}));

}  // namespace

}  // namespace trident
