#include "plan/layout_pins.h"

#include "kernels/base/error.h"

namespace trident {

const std::vector<std::string>& layout_keys() {
  static const std::vector<std::string> keys = {
      "parallel.dp",   "parallel.tp",       "parallel.cp",   "parallel.ep",     "parallel.pp",
      "parallel.vpp",  "parallel.schedule", "parallel.zero", "train.recompute", "train.recompute_layers",
      "train.micro_batch",
      "parallel.sequence_parallel"};
  return keys;
}

std::string layout_value(const Config& c, const std::string& key) {
  const ParallelConfig& p = c.parallel;
  if (key == "parallel.dp") return std::to_string(p.dp);
  if (key == "parallel.tp") return std::to_string(p.tp);
  if (key == "parallel.cp") return std::to_string(p.cp);
  if (key == "parallel.ep") return std::to_string(p.ep);
  if (key == "parallel.pp") return std::to_string(p.pp);
  if (key == "parallel.vpp") return std::to_string(p.vpp);
  if (key == "parallel.schedule") return name_of(p.schedule);
  if (key == "parallel.zero") return std::to_string(p.zero);
  if (key == "train.recompute") return name_of(c.train.recompute);
  if (key == "train.recompute_layers") return std::to_string(c.train.recompute_layers);
  if (key == "train.micro_batch") return std::to_string(c.train.micro_batch);
  if (key == "parallel.sequence_parallel") return p.sequence_parallel ? "true" : "false";
  check(false, "layout_value: '" + key + "' is not a layout key");
  return "";
}

std::string LayoutPins::describe(const Config& config) const {
  std::string text;
  for (const std::string& key : layout_keys())
    if (pinned(key)) text += (text.empty() ? "" : ", ") + key + "=" + layout_value(config, key);
  return text;
}

LayoutPins layout_pins(const std::set<std::string>& given, const Config& config) {
  LayoutPins pins;
  for (const std::string& key : layout_keys())
    if (given.count(key) > 0) pins.keys.insert(key);
  if (config.parallel.dp == 0) pins.keys.erase("parallel.dp");
  if (config.train.micro_batch == 0) pins.keys.erase("train.micro_batch");  // 0: the whole per-rank batch, derived
  return pins;
}

}  // namespace trident
