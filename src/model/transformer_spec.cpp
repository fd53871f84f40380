#include "model/transformer_spec.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "model/families/family.h"
#include "model/parameters.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

// The mixture-of-experts keys set away from their defaults, as "model.n_experts, ...". A
// key set to its default cannot be told from one left out, and means nothing either way
// (a printed config, a dense Hugging Face import list them all at their defaults).
std::string moe_keys_set(const ModelConfig& c) {
  const ModelConfig d;
  const std::pair<const char*, bool> keys[] = {
      {"n_experts", c.n_experts != d.n_experts},
      // 2: its default before 0 stood for the family's (manifests and printed configs of
      // dense runs from then record it).
      {"n_experts_per_token", c.n_experts_per_token != d.n_experts_per_token && c.n_experts_per_token != 2},
      {"moe_ffn_dim", c.moe_ffn_dim != d.moe_ffn_dim},
      {"moe_norm_topk", c.moe_norm_topk != d.moe_norm_topk},
      {"moe_router_score", c.moe_router_score != d.moe_router_score},
      {"moe_router_bias_update_rate", c.moe_router_bias_update_rate != d.moe_router_bias_update_rate},
      {"moe_capacity_factor", c.moe_capacity_factor != d.moe_capacity_factor},
      {"moe_dropless_headroom", c.moe_dropless_headroom != d.moe_dropless_headroom},
      {"moe_token_drop_policy", c.moe_token_drop_policy != d.moe_token_drop_policy},
      {"router_aux_loss_coef", c.router_aux_loss_coef != d.router_aux_loss_coef},
      {"router_z_loss_coef", c.router_z_loss_coef != d.router_z_loss_coef},
  };
  std::string set;
  for (const auto& [key, differs] : keys)
    if (differs) set += (set.empty() ? "model." : ", model.") + std::string(key);
  return set;
}

}  // namespace

TransformerSpec transformer_spec(const ModelConfig& c) {
  const ModelFamily& family = model_family(c.family);
  TransformerSpec s;
  s.family = c.family;
  s.n_layer = c.n_layer;
  s.n_head = c.n_head;
  s.n_kv_head = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  s.d_model = c.d_model;
  s.seq_len = c.seq_len;
  s.vocab_size = c.vocab_size;
  s.norm_eps = c.norm_eps;
  s.rope_theta = c.rope_theta;
  s.rope_scaling = c.rope_scaling;
  s.sliding_window = c.sliding_window;
  require(c.n_head > 0 && (c.head_dim > 0 || c.d_model % c.n_head == 0),
          "model.d_model (" + std::to_string(c.d_model) + ") must be a multiple of model.n_head (" +
              std::to_string(c.n_head) + "), or model.head_dim given");
  s.head_dim = c.head_dim > 0 ? c.head_dim : c.d_model / c.n_head;
  s.tied_head = c.tie_word_embeddings;
  family.configure(c, s);
  if (s.n_experts == 0) {
    const std::string set = moe_keys_set(c);
    require(set.empty(), set + (set.find(',') == std::string::npos ? " applies" : " apply") +
                             " to a mixture-of-experts family (mixtral, qwen3_moe), not " + c.family);
  }
  s.config = c;
  s.config.n_kv_head = s.n_kv_head;
  s.config.head_dim = s.head_dim;
  s.config.tie_word_embeddings = s.tied_head;
  s.config.ffn_dim = s.ffn_dim;
  if (s.n_experts > 0) {
    s.config.n_experts = s.n_experts;
    s.config.n_experts_per_token = s.experts_per_token;
    s.config.moe_ffn_dim = s.moe_ffn_dim;
  }
  return s;
}

std::string TransformerSpec::describe() const {
  std::string s = family + " L" + std::to_string(n_layer) + " H" + std::to_string(n_head);
  if (n_kv_head != n_head) s += " KV" + std::to_string(n_kv_head);
  s += " d" + std::to_string(d_model);
  if (head_dim * n_head != d_model) s += " hd" + std::to_string(head_dim);
  if (ffn_dim != 4 * d_model) s += " F" + std::to_string(ffn_dim);
  if (n_experts > 0)
    s += " E" + std::to_string(n_experts) + "x" + std::to_string(moe_ffn_dim) + " top" + std::to_string(experts_per_token);
  s += " T" + std::to_string(seq_len) + " V" + std::to_string(vocab_size);
  if (sliding_window > 0) s += " window " + std::to_string(sliding_window);  // Mistral's: what each token sees
  return s;
}

void check_tensor_parallel(const TransformerSpec& s, int tp) {
  require(s.n_head % tp == 0, "parallel.tp (" + std::to_string(tp) + ") must divide model.n_head (" +
                                  std::to_string(s.n_head) + "): attention heads are split over tp");
  require(s.ffn_dim % tp == 0, "parallel.tp (" + std::to_string(tp) + ") must divide the MLP width model.ffn_dim (" +
                                   std::to_string(s.ffn_dim) + ")");
  require(s.moe_ffn_dim % tp == 0, "parallel.tp (" + std::to_string(tp) +
                                       ") must divide each expert's width model.moe_ffn_dim (" +
                                       std::to_string(s.moe_ffn_dim) + ")");
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

std::string parameter_summary(const TransformerSpec& spec) {
  const int64_t all = parameter_count(spec), active = active_parameter_count(spec);
  char text[80];
  if (active == all)
    std::snprintf(text, sizeof text, "%.2fB parameters", all / 1e9);
  else  // a mixture of experts: what a token passes through (the step's work, MFU)
    std::snprintf(text, sizeof text, "%.2fB parameters, %.2fB active", all / 1e9, active / 1e9);
  return text;
}

int64_t active_parameter_count(const TransformerSpec& spec) {
  const ParameterLayout whole(spec);
  double n = 0;
  for (const ParameterTensor& t : whole.tensors()) n += static_cast<double>(t.numel()) * t.placement.active;
  return static_cast<int64_t>(n + 0.5);
}

double flops_per_token(const TransformerSpec& spec) {
  const ParameterLayout whole(spec);
  double n = 0;
  for (const ParameterTensor& t : whole.tensors())
    if (t.placement.multiplied) n += static_cast<double>(t.numel()) * t.placement.active;
  return 6.0 * n + 12.0 * spec.n_layer * static_cast<double>(spec.seq_len) * spec.attention_width();
}

size_t rope_table_floats(const TransformerSpec& spec) { return static_cast<size_t>(spec.seq_len) * 2 * (spec.head_dim / 2); }

}  // namespace trident
