// Qwen3 (Qwen team 2025; Hugging Face's Qwen3ForCausalLM): a Llama whose attention
// RMS-normalizes each head's q and k (q_norm, k_norm over head_dim) before the rotary
// embedding, and no biases.
#include "model/families/llama_style.h"

namespace trident {

namespace {

const bool registered = register_family(llama_style({
    .name = "qwen3",
    .qk_norm = QkNormKind::per_head,
    .hf = llama_style_hf({{"architectures", {"Qwen3ForCausalLM"}},
                         {"model_type", "qwen3"},
                         {"hidden_act", "silu"},
                         {"attention_bias", false},
                         {"use_sliding_window", false},
                         {"attention_dropout", 0.0}},
                         {.vocab = 151936, .hidden = 4096, .intermediate = 22016, .layers = 32, .heads = 32,
                          .max_positions = 32768}),
}));

}  // namespace

}  // namespace trident
