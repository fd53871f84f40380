// Qwen2 (Yang et al. 2024; Hugging Face's Qwen2ForCausalLM): a Llama with biases on the q, k
// and v projections (not on the output's). The 7B and larger models have a head of their
// own; the small ones tie it to the token table (model.tie_word_embeddings).
#include "model/families/llama_style.h"

namespace trident {

namespace {

const bool registered = register_family(llama_style({
    .name = "qwen2",
    .qkv_bias = true,
    .hf = llama_style_hf({{"architectures", {"Qwen2ForCausalLM"}},
                         {"model_type", "qwen2"},
                         {"hidden_act", "silu"},
                         {"use_sliding_window", false},
                         {"attention_dropout", 0.0}},
                         {.vocab = 151936, .hidden = 4096, .intermediate = 22016, .layers = 32, .heads = 32,
                          .max_positions = 32768}),
}));

}  // namespace

}  // namespace trident
