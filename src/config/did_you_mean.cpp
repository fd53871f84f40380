#include "config/did_you_mean.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace trident {

namespace {

// Long names a newcomer brings from Megatron-LM, torchtitan or a Hugging Face config.json.
constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
    {"data_parallel", "parallel.dp"},
    {"tensor_parallel", "parallel.tp"},
    {"pipeline_parallel", "parallel.pp"},
    {"context_parallel", "parallel.cp"},
    {"expert_parallel", "parallel.ep"},
    {"virtual_pipeline_parallel", "parallel.vpp"},
    {"num_hidden_layers", "model.n_layer"},
    {"num_attention_heads", "model.n_head"},
    {"num_key_value_heads", "model.n_kv_head"},
    {"hidden_size", "model.d_model"},
    {"intermediate_size", "model.ffn_dim"},
    {"num_local_experts", "model.n_experts"},
    {"num_experts", "model.n_experts"},
    {"num_experts_per_tok", "model.n_experts_per_token"},
    {"moe_intermediate_size", "model.moe_ffn_dim"},
    {"max_position_embeddings", "model.seq_len"},
};

// Lower case, '-' as '_': how a name is compared when only its spelling's form differs.
std::string folded(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> closest_names(std::string_view unknown, const std::vector<std::string>& names) {
  std::vector<std::string> close;
  if (unknown.empty()) return close;
  size_t best = std::max<size_t>(2, unknown.size() / 4);
  for (const std::string& name : names) {
    const size_t d = name.starts_with(unknown) ? 0 : edit_distance(unknown, name);
    if (d < best) close.clear(), best = d;
    if (d == best) close.push_back(name);
  }
  if (close.size() > 3) close.clear();
  return close;
}

std::string closest_choice(std::string_view text, const char* const* names, size_t count) {
  std::vector<std::string> folded_names;
  for (size_t i = 0; i < count; i++) {
    if (folded(names[i]) == folded(text)) return names[i];
    folded_names.push_back(folded(names[i]));
  }
  const std::vector<std::string> close = closest_names(folded(text), folded_names);
  if (close.size() != 1) return "";
  for (size_t i = 0; i < count; i++)
    if (folded_names[i] == close[0]) return names[i];
  return "";
}

std::string key_alias(std::string_view unknown_key) {
  const size_t dot = unknown_key.find('.');
  const std::string name = folded(dot == std::string_view::npos ? unknown_key : unknown_key.substr(dot + 1));
  for (const auto& [alias, key] : kAliases)
    if (name == alias) return std::string(key);
  return "";
}

}  // namespace trident
