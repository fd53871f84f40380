// GPT-2 (Radford et al. 2019; Hugging Face's GPT2LMHeadModel, llm.c): learned positions,
// LayerNorm with biases, GELU (tanh), biases on every projection, the head tied to the
// token embedding. Names and shapes: shared/reference/FORMAT.md.
#include "kernels/base/error.h"
#include "model/families/family.h"
#include "model/layers/attention.h"
#include "model/layers/mlp.h"

namespace trident {

namespace {

void configure(const ModelConfig& c, TransformerSpec& s) {
  require(s.n_kv_head == s.n_head, "model.n_kv_head (" + std::to_string(c.n_kv_head) +
                                       ") applies to model.family = llama; GPT-2 has one key/value head per head");
  require(c.rope_scaling.type == "none", "model.rope_scaling applies to model.family = llama");
  require(c.sliding_window == 0, "model.sliding_window applies to model.family = mistral");
  require(c.head_dim == 0 || c.head_dim * c.n_head == c.d_model,
          "model.head_dim (" + std::to_string(c.head_dim) + ") applies to the llama-style families; GPT-2's heads are "
          "model.d_model / model.n_head wide");
  s.ffn_dim = c.ffn_dim > 0 ? c.ffn_dim : 4 * c.d_model;
  s.positions = PositionKind::learned;
  s.mlp = MlpKind::gelu;
  s.tied_head = true;
}

std::unique_ptr<Norm> layernorm(const TransformerSpec& s, const std::string& name) {
  return std::make_unique<Norm>(NormKind::layernorm, name, s.d_model, s.norm_eps);
}

std::unique_ptr<Block> block(const TransformerSpec& s, int layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  auto b = std::make_unique<Block>(s.d_model);
  b->add_branch(layernorm(s, h + "ln_1"), std::make_unique<Attention>(AttentionOptions{
                                              .qkv = {h + "attn.c_attn"},
                                              .out = h + "attn.c_proj",
                                              .d_model = s.d_model,
                                              .n_head = s.n_head,
                                              .n_kv_head = s.n_kv_head,
                                              .head_dim = s.head_dim,
                                              .qkv_bias = true,
                                              .out_bias = true}));
  b->add_branch(layernorm(s, h + "ln_2"), std::make_unique<Mlp>(MlpOptions{.activation = MlpKind::gelu,
                                                                          .in = {h + "mlp.c_fc"},
                                                                          .out = h + "mlp.c_proj",
                                                                          .d_model = s.d_model,
                                                                          .ffn = s.ffn_dim,
                                                                          .bias = true}));
  return b;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const bool registered = register_family({
    .name = "gpt2",
    .configure = configure,
    .embedding =
        [](const TransformerSpec& s, bool table_only) {
          return std::make_unique<Embedding>(EmbeddingOptions{.tokens = "wte.weight",
                                                              .positions = "wpe.weight",
                                                              .vocab = s.vocab_size,
                                                              .d_model = s.d_model,
                                                              .seq_len = s.seq_len,
                                                              .tied = true,
                                                              .table_only = table_only});
        },
    .block = block,
    .final_norm = [](const TransformerSpec& s) { return layernorm(s, "ln_f"); },
    .head =
        [](const TransformerSpec& s) {
          return std::make_unique<Head>(HeadOptions{.table = "wte.weight", .vocab = s.vocab_size,
                                                    .d_model = s.d_model, .tied = true});
        },
    .hf = {
        .constants = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"activation_function", "gelu_new"},
                      {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"attn_pdrop", 0.0},
                      {"scale_attn_weights", true},
                      {"tie_word_embeddings", true}},
        .fields = {{"n_layer", "n_layer", 12},
                   {"n_head", "n_head", 12},
                   {"d_model", "n_embd", 768},
                   {"ffn_dim", "n_inner", 0, "n_embd", 4},
                   {"seq_len", "n_positions", 1024},  // the file's positions must cover the context (wpe's rows)
                   {"vocab_size", "vocab_size", 50257},
                   {"norm_eps", "layer_norm_epsilon", 1e-5}},
        .finish =
            [](const TransformerSpec& s, nlohmann::ordered_json& c) {
              if (s.ffn_dim == 4 * s.d_model) c["n_inner"] = nullptr;  // HF's default: 4 n_embd
              c["n_ctx"] = s.seq_len;
              if (s.vocab_size == 50257) c["bos_token_id"] = c["eos_token_id"] = 50256;  // <|endoftext|>
            },
        // HF's files may prefix "transformer."; the head is tied (not a tensor of its own),
        // attn.bias and attn.masked_bias are causal-mask buffers.
        .parameter_name =
            [](const std::string& hf) {
              const std::string name = hf.rfind("transformer.", 0) == 0 ? hf.substr(12) : hf;
              if (name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"))
                return std::string();
              return name;
            },
        .transposed = {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"},
    },
});

}  // namespace

}  // namespace trident
