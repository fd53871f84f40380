#include "model/families/family.h"

#include "config/registry.h"

namespace trident {

namespace {

Registry<ModelFamily>& registry() {
  static Registry<ModelFamily> families("model.family");
  return families;
}

}  // namespace

bool register_family(ModelFamily family) {
  const std::string name = family.name;
  return registry().add(name, std::move(family));
}

const ModelFamily& model_family(const std::string& name) { return registry().at(name); }

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
