#include "model/hf_conventions.h"

#include <cmath>
#include <sstream>

namespace trident {

namespace {

bool is_gpt2(const TransformerSpec& spec) { return spec.family == Family::gpt2; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

nlohmann::ordered_json hf_config(const TransformerSpec& s, const std::string& torch_dtype) {
  if (is_gpt2(s)) {
    nlohmann::ordered_json c = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", s.vocab_size},
            {"n_positions", s.seq_len},
            {"n_ctx", s.seq_len},
            {"n_embd", s.d_model},
            {"n_layer", s.n_layer},
            {"n_head", s.n_head},
            {"n_inner", s.ffn_dim == 4 * s.d_model ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.ffn_dim)},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", s.norm_eps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", torch_dtype}};
    if (s.vocab_size == 50257) c["bos_token_id"] = c["eos_token_id"] = 50256;  // GPT-2's own tokenizer: <|endoftext|>
    return c;
  }
  nlohmann::ordered_json c = {{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"vocab_size", s.vocab_size},
                              {"hidden_size", s.d_model},
                              {"intermediate_size", s.ffn_dim},
                              {"num_hidden_layers", s.n_layer},
                              {"num_attention_heads", s.n_head},
                              {"num_key_value_heads", s.n_kv_head},
                              {"head_dim", s.head_dim},
                              {"hidden_act", "silu"},
                              {"max_position_embeddings", s.seq_len},
                              {"rms_norm_eps", s.norm_eps},
                              {"rope_theta", s.rope_theta},
                              {"rope_scaling", nullptr},
                              {"attention_bias", false},
                              {"mlp_bias", false},
                              {"tie_word_embeddings", false},
                              {"torch_dtype", torch_dtype}};
  if (s.rope_scaling.type == "llama3")
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_scaling.factor},
                         {"low_freq_factor", s.rope_scaling.low_freq_factor},
                         {"high_freq_factor", s.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", s.rope_scaling.original_max_position}};
  return c;
}

std::vector<std::string> hf_config_mismatches(const nlohmann::json& c, const TransformerSpec& s) {
  std::vector<std::string> out;
  const auto number = [&](const char* field, double fallback) {
    return c.contains(field) && c[field].is_number() ? c[field].get<double>() : fallback;
  };
  const auto expect = [&](const char* field, double file, const char* key, double model) {
    const bool same = std::abs(file - model) <= 1e-9 * std::max(1.0, std::abs(model));
    if (same) return;
    std::ostringstream m;
    m << field << " = " << file << ", but " << key << " = " << model;
    out.push_back(m.str());
  };
  const std::string type = c.value("model_type", "");
  if (is_gpt2(s)) {
    if (type != "gpt2") out.push_back("model_type = '" + type + "', but model.family = gpt2");
    expect("vocab_size", number("vocab_size", 50257), "model.vocab_size", s.vocab_size);
    expect("n_embd", number("n_embd", 768), "model.d_model", s.d_model);
    expect("n_layer", number("n_layer", 12), "model.n_layer", s.n_layer);
    expect("n_head", number("n_head", 12), "model.n_head", s.n_head);
    expect("n_inner", c.contains("n_inner") && c["n_inner"].is_number() ? c["n_inner"].get<double>() : 4.0 * s.d_model,
           "model.ffn_dim", s.ffn_dim);
    // The file's positions must cover the model's context (wpe's rows).
    expect("n_positions", number("n_positions", 1024), "model.seq_len", s.seq_len);
    expect("layer_norm_epsilon", number("layer_norm_epsilon", 1e-5), "model.norm_eps", s.norm_eps);
    return out;
  }
  if (type != "llama") out.push_back("model_type = '" + type + "', but model.family = llama");
  const double heads = number("num_attention_heads", 32);
  expect("vocab_size", number("vocab_size", 32000), "model.vocab_size", s.vocab_size);
  expect("hidden_size", number("hidden_size", 4096), "model.d_model", s.d_model);
  expect("intermediate_size", number("intermediate_size", 11008), "model.ffn_dim", s.ffn_dim);
  expect("num_hidden_layers", number("num_hidden_layers", 32), "model.n_layer", s.n_layer);
  expect("num_attention_heads", heads, "model.n_head", s.n_head);
  expect("num_key_value_heads", number("num_key_value_heads", heads), "model.n_kv_head", s.n_kv_head);
  expect("rms_norm_eps", number("rms_norm_eps", 1e-6), "model.norm_eps", s.norm_eps);
  expect("rope_theta", number("rope_theta", 10000), "model.rope_theta", s.rope_theta);
  if (c.contains("head_dim") && c["head_dim"].is_number())
    expect("head_dim", c["head_dim"].get<double>(), "model.d_model / model.n_head", s.head_dim);
  const bool scaled = c.contains("rope_scaling") && c["rope_scaling"].is_object();
  const std::string rope_type = scaled ? c["rope_scaling"].value("rope_type", c["rope_scaling"].value("type", "")) : "";
  if ((scaled ? rope_type : std::string("none")) != s.rope_scaling.type)
    out.push_back("rope_scaling = " + (scaled ? rope_type : std::string("null")) + ", but model.rope_scaling = " +
                  s.rope_scaling.type);
  else if (scaled) {
    const nlohmann::json& r = c["rope_scaling"];
    const auto field = [&](const char* name, double fallback) {
      return r.contains(name) && r[name].is_number() ? r[name].get<double>() : fallback;
    };
    expect("rope_scaling.factor", field("factor", 8), "model.rope_factor", s.rope_scaling.factor);
    expect("rope_scaling.low_freq_factor", field("low_freq_factor", 1), "model.rope_low_freq_factor",
           s.rope_scaling.low_freq_factor);
    expect("rope_scaling.high_freq_factor", field("high_freq_factor", 4), "model.rope_high_freq_factor",
           s.rope_scaling.high_freq_factor);
    expect("rope_scaling.original_max_position_embeddings", field("original_max_position_embeddings", 8192),
           "model.rope_original_max_position", s.rope_scaling.original_max_position);
  }
  if (c.value("tie_word_embeddings", false)) out.push_back("tie_word_embeddings = true, but Llama's head is untied");
  return out;
}

std::string parameter_name_from_hf(const TransformerSpec& s, const std::string& hf) {
  if (ends_with(hf, ".rotary_emb.inv_freq")) return "";
  if (!is_gpt2(s)) return hf;
  std::string name = hf.rfind("transformer.", 0) == 0 ? hf.substr(12) : hf;
  if (name == "lm_head.weight") return "";  // tied to wte
  if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return "";  // causal-mask buffers
  return name;
}

bool hf_stores_transposed(const TransformerSpec& s, const std::string& name) {
  if (!is_gpt2(s)) return false;
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

}  // namespace trident
