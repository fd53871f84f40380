#include "train/resume_settings.h"

#include <sstream>

#include "kernels/base/error.h"
#include "model/transformer_spec.h"

namespace trident {

namespace {

std::string setting(const char* key, int value) { return "model." + std::string(key) + "=" + std::to_string(value); }

template <class T>
std::string shown(const T& value) {
  std::ostringstream s;
  s << std::boolalpha << value;
  return s.str();
}

}  // namespace

std::string check_resumed_experts(const ModelConfig& checkpoint, const ModelConfig& now, const std::string& dir) {
  const TransformerSpec was = transformer_spec(checkpoint), is = transformer_spec(now);
  if (was.n_experts == 0 && is.n_experts == 0) return "";
  const std::pair<const char*, std::pair<int, int>> shapes[] = {{"n_experts", {was.n_experts, is.n_experts}},
                                                               {"moe_ffn_dim", {was.moe_ffn_dim, is.moe_ffn_dim}}};
  for (const auto& [key, values] : shapes)
    require(values.first == values.second,
            "checkpoint " + dir + " has " + setting(key, values.first) + ", this run " + setting(key, values.second) +
                ": the experts' tensors would not fit; resume with --" + setting(key, values.first) +
                " or start afresh in another checkpoint.dir");
  std::string changed;
  const auto compare = [&](const char* key, const auto& before, const auto& after) {
    if (before == after) return;
    changed += (changed.empty() ? "" : ", ") + std::string("model.") + key + " " + shown(before) + " -> " + shown(after);
  };
  compare("n_experts_per_token", was.experts_per_token, is.experts_per_token);  // 0: the family's
  compare("moe_capacity_factor", checkpoint.moe_capacity_factor, now.moe_capacity_factor);
  compare("moe_token_drop_policy", checkpoint.moe_token_drop_policy, now.moe_token_drop_policy);
  compare("moe_router_score", checkpoint.moe_router_score, now.moe_router_score);
  compare("moe_router_bias_update_rate", checkpoint.moe_router_bias_update_rate, now.moe_router_bias_update_rate);
  compare("moe_norm_topk", checkpoint.moe_norm_topk, now.moe_norm_topk);
  return changed.empty() ? "" : "routing changed since the checkpoint: " + changed;
}

}  // namespace trident
