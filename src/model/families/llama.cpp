// Llama (Touvron et al. 2023; Meta's reference, Hugging Face's LlamaForCausalLM): rotary
// positions (Llama 3.1's frequency scaling optional), RMSNorm, SwiGLU, grouped-query
// attention, no biases, a head of its own (model.tie_word_embeddings: the token table).
// Names and shapes: shared/reference/FORMAT.md.
#include "model/families/llama_style.h"

namespace trident {

namespace {

const bool registered = register_family(llama_style({
    .name = "llama",
    .hf = llama_style_hf({{"architectures", {"LlamaForCausalLM"}},
                         {"model_type", "llama"},
                         {"hidden_act", "silu"},
                         {"attention_bias", false},
                         {"mlp_bias", false}},
                         {.vocab = 32000, .hidden = 4096, .intermediate = 11008, .layers = 32, .heads = 32,
                          .max_positions = 2048}),
}));

}  // namespace

}  // namespace trident
