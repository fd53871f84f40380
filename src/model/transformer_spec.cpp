#include "model/transformer_spec.h"

#include <cmath>
#include <numbers>

#include "model/parameters.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

std::string key_value(const char* key, int value) { return std::string(key) + " (" + std::to_string(value) + ")"; }

// Llama's MLP width when none is given: 2/3 of 4d, rounded up to a multiple of 256
// (Meta's ModelArgs with multiple_of = 256).
int llama_default_ffn(int d) { return (8 * d / 3 + 255) / 256 * 256; }

}  // namespace

TransformerSpec transformer_spec(const ModelConfig& c) {
  TransformerSpec s;
  s.family = c.family;
  s.n_layer = c.n_layer;
  s.n_head = c.n_head;
  s.n_kv_head = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  s.d_model = c.d_model;
  s.seq_len = c.seq_len;
  s.vocab_size = c.vocab_size;
  s.norm_eps = c.norm_eps;
  require(c.n_head > 0 && c.d_model % c.n_head == 0, key_value("model.d_model", c.d_model) +
                                                         " must be a multiple of " + key_value("model.n_head", c.n_head));
  s.head_dim = c.d_model / c.n_head;
  if (c.family == Family::gpt2) {
    require(s.n_kv_head == s.n_head, "model.n_kv_head (" + std::to_string(c.n_kv_head) +
                                         ") applies to model.family = llama; GPT-2 has one key/value head per head");
    require(c.rope_scaling.type == "none", "model.rope_scaling applies to model.family = llama");
    s.ffn_dim = c.ffn_dim > 0 ? c.ffn_dim : 4 * c.d_model;
    s.token_embedding = "wte.weight";
    s.position_embedding = "wpe.weight";
    s.final_norm = "ln_f";
    return s;
  }
  require(s.n_kv_head <= s.n_head && s.n_head % s.n_kv_head == 0,
          key_value("model.n_kv_head", c.n_kv_head) + " must divide " + key_value("model.n_head", c.n_head) +
              ": each key/value head serves a group of query heads");
  require(s.head_dim % 2 == 0, "rotary embeddings turn pairs of channels: the head dimension model.d_model / "
                               "model.n_head (" + std::to_string(s.head_dim) + ") must be even");
  require(c.rope_theta > 0, "model.rope_theta must be positive");
  require(c.rope_scaling.type == "none" || c.rope_scaling.type == "llama3",
          "model.rope_scaling must be none or llama3, got '" + c.rope_scaling.type + "'");
  if (c.rope_scaling.type == "llama3")
    require(c.rope_scaling.factor >= 1 && c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor &&
                c.rope_scaling.low_freq_factor > 0 && c.rope_scaling.original_max_position > 0,
            "model.rope_scaling = llama3 needs rope_factor >= 1, rope_high_freq_factor > rope_low_freq_factor > 0 "
            "and rope_original_max_position > 0");
  s.ffn_dim = c.ffn_dim > 0 ? c.ffn_dim : llama_default_ffn(c.d_model);
  s.norm = NormKind::rmsnorm;
  s.positions = PositionKind::rotary;
  s.mlp = MlpKind::swiglu;
  s.biases = false;
  s.tied_head = false;
  s.rope_theta = c.rope_theta;
  s.rope_scaling = c.rope_scaling;
  s.token_embedding = "model.embed_tokens.weight";
  s.final_norm = "model.norm";
  s.head = "lm_head.weight";
  return s;
}

BlockNames TransformerSpec::block(int layer) const {
  if (family == Family::gpt2) {
    const std::string p = "h." + std::to_string(layer) + ".";
    return {p + "ln_1", p + "ln_2", {p + "attn.c_attn"}, p + "attn.c_proj", {p + "mlp.c_fc"}, p + "mlp.c_proj"};
  }
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  return {p + "input_layernorm",
          p + "post_attention_layernorm",
          {p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"},
          p + "self_attn.o_proj",
          {p + "mlp.gate_proj", p + "mlp.up_proj"},
          p + "mlp.down_proj"};
}

std::string TransformerSpec::describe() const {
  std::string s = std::string(name_of(family)) + " L" + std::to_string(n_layer) + " H" + std::to_string(n_head);
  if (n_kv_head != n_head) s += " KV" + std::to_string(n_kv_head);
  s += " d" + std::to_string(d_model);
  if (ffn_dim != 4 * d_model) s += " F" + std::to_string(ffn_dim);
  return s + " T" + std::to_string(seq_len) + " V" + std::to_string(vocab_size);
}

void check_tensor_parallel(const TransformerSpec& s, int tp) {
  require(s.n_head % tp == 0, "parallel.tp (" + std::to_string(tp) + ") must divide model.n_head (" +
                                  std::to_string(s.n_head) + "): attention heads are split over tp");
  require(s.ffn_dim % tp == 0, "parallel.tp (" + std::to_string(tp) + ") must divide the MLP width model.ffn_dim (" +
                                   std::to_string(s.ffn_dim) + ")");
  require(s.n_kv_head % tp == 0 || tp % s.n_kv_head == 0,
          "parallel.tp (" + std::to_string(tp) + ") and model.n_kv_head (" + std::to_string(s.n_kv_head) +
              ") do not fit: tp must divide the key/value heads, or be a multiple of them (each head then "
              "replicated on tp / n_kv_head ranks)");
}

int64_t parameter_count(const TransformerSpec& spec) {
  const ParameterLayout whole(spec);
  int64_t n = 0;
  for (const ParameterTensor& t : whole.tensors()) n += static_cast<int64_t>(t.numel());
  return n;
}

double flops_per_token(const TransformerSpec& spec) {
  const ParameterLayout whole(spec);
  double n = 0;
  for (const ParameterTensor& t : whole.tensors()) {
    const bool lookup_only = t.name == spec.position_embedding || (!spec.tied_head && t.name == spec.token_embedding);
    if (!lookup_only) n += static_cast<double>(t.numel());
  }
  return 6.0 * n + 12.0 * spec.n_layer * static_cast<double>(spec.seq_len) * spec.attention_width();
}

std::vector<double> rope_frequencies(const TransformerSpec& spec) {
  const int pairs = spec.head_dim / 2;
  std::vector<double> freq(pairs);
  for (int i = 0; i < pairs; i++) freq[i] = std::pow(spec.rope_theta, -2.0 * i / spec.head_dim);
  const RopeScaling& r = spec.rope_scaling;
  if (r.type != "llama3") return freq;
  // Llama 3.1 (Hugging Face's _compute_llama3_parameters): wavelengths longer than the
  // original context / low_freq_factor slow down by `factor`, shorter than
  // context / high_freq_factor stay, and those between blend smoothly.
  const double low_wavelen = r.original_max_position / r.low_freq_factor;
  const double high_wavelen = r.original_max_position / r.high_freq_factor;
  for (double& f : freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (r.original_max_position / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return freq;
}

size_t rope_table_floats(const TransformerSpec& spec) { return static_cast<size_t>(spec.seq_len) * 2 * (spec.head_dim / 2); }

std::vector<float> rope_table(const TransformerSpec& spec) {
  const std::vector<double> freq = rope_frequencies(spec);
  const size_t pairs = freq.size();
  std::vector<float> table(rope_table_floats(spec));
  for (int t = 0; t < spec.seq_len; t++)
    for (size_t i = 0; i < pairs; i++) {
      const double angle = t * freq[i];
      table[(t * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      table[(t * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  return table;
}

}  // namespace trident
