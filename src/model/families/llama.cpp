// Llama (Touvron et al. 2023; Meta's reference, Hugging Face's LlamaForCausalLM): rotary
// positions (Llama 3.1's frequency scaling optional), RMSNorm, SwiGLU, grouped-query
// attention, no biases, an untied head. Names and shapes: shared/reference/FORMAT.md.
#include "model/families/llama_style.h"

namespace trident {

namespace {

const bool registered = register_family(llama_style({
    .name = "llama",
    .hf = {.constants = {{"architectures", {"LlamaForCausalLM"}},
                         {"model_type", "llama"},
                         {"hidden_act", "silu"},
                         {"attention_bias", false},
                         {"mlp_bias", false},
                         {"tie_word_embeddings", false}},
           .fields = llama_hf_fields({.vocab = 32000, .hidden = 4096, .intermediate = 11008, .layers = 32,
                                      .heads = 32, .max_positions = 2048}),
           .rope_scaling = true,
           .finish = llama_hf_finish,
           .check = llama_hf_check},
}));

}  // namespace

}  // namespace trident
