// Mistral (Jiang et al. 2023; Hugging Face's MistralForCausalLM): a Llama with sliding-window
// attention: each token sees the model.sliding_window latest tokens, itself included (0, HF's
// null: all earlier tokens, as Mistral 7B v0.2 and later).
#include "model/families/llama_style.h"

namespace trident {

namespace {

const LlamaHfDefaults kDefaults = {.vocab = 32000, .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
                                   .max_positions = 131072};
HfField sliding_window() {
  return {.key = "sliding_window", .hf = "sliding_window", .hf_default = 4096, .null_is_zero = true};
}

const bool registered = register_family(llama_style({
    .name = "mistral",
    .sliding_window = true,
    .hf = llama_style_hf({{"architectures", {"MistralForCausalLM"}},
                         {"model_type", "mistral"},
                         {"hidden_act", "silu"},
                         {"attention_dropout", 0.0}},
                         kDefaults, {sliding_window()}),
}));

}  // namespace

}  // namespace trident
