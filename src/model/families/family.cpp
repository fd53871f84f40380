#include "model/families/family.h"

#include <map>

#include "config/choices.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

std::map<std::string, ModelFamily>& registry() {
  static std::map<std::string, ModelFamily> families;
  return families;
}

}  // namespace

bool register_family(ModelFamily family) {
  check(!registry().contains(family.name), "model family " + family.name + " registered twice");
  const std::string name = family.name;
  registry().emplace(name, std::move(family));
  return true;
}

const ModelFamily& model_family(const std::string& name) {
  const auto it = registry().find(name);
  if (it != registry().end()) return it->second;
  std::vector<const char*> names;
  for (const auto& [known, family] : registry()) names.push_back(known.c_str());
  throw_bad_choice("model.family", join_choices(names.data(), names.size()), name);
}

StageLayers make_stage_layers(const TransformerSpec& spec, const StageSpec& stage) {
  const ModelFamily& family = model_family(spec.family);
  StageLayers s;
  if (stage.has_embedding || (stage.has_head && spec.tied_head)) s.embedding = family.embedding(spec, !stage.has_embedding);
  for (const LayerRange& chunk : stage.chunks) {
    const int last = chunk.count < 0 ? spec.n_layer : chunk.first + chunk.count;
    for (int layer = chunk.first; layer < last; layer++) s.blocks.push_back(family.block(spec, layer));
  }
  if (stage.has_head) {
    s.final_norm = family.final_norm(spec);
    s.head = family.head(spec);
  }
  return s;
}

}  // namespace trident
