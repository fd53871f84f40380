// A model family, registered by name (model.family; torchtitan's ModelSpec, Megatron-Core's
// layer specs): what it makes of a config (its spec: the defaults, the checks, the options
// the planners read), the layers of its model (the embedding, each block's residual
// branches, the final norm and the head, with their tensors' names), and Hugging Face's
// conventions for it (config.json's fields for the config's keys, tensor names). Each
// family is one file here that registers itself (gpt2.cpp, llama.cpp); nothing else in
// trident branches on the family.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/layers/embedding.h"
#include "model/layers/head.h"
#include "model/layers/norm.h"
#include "model/transformer_spec.h"

namespace trident {

// One field of Hugging Face's config.json for a key of ModelConfig
// (config/config.h's visit_model_fields).
struct HfField {
  const char* key;          // ours: "n_layer"
  const char* hf;           // HF's: "num_hidden_layers"
  double hf_default = 0;    // what HF assumes when the file leaves it out (or null)...
  const char* default_from = nullptr;  // ...or this field's value times default_factor
  double default_factor = 1;
  bool checked = true;      // an imported config.json must agree with the model
  bool null_is_zero = false;  // our 0 is HF's null (Mistral's sliding_window: none)
  bool required = false;      // an imported config.json must have it (no default stands for it)
};

struct HfConventions {
  nlohmann::ordered_json constants;  // the fixed fields written first (architectures, model_type, ...)
  std::vector<HfField> fields;       // written, and checked, from the config's keys
  bool rope_scaling = false;         // the rope_scaling object (null, or llama3's factors)
  // What the table cannot say: fields written after it, mismatches found beyond it.
  std::function<void(const TransformerSpec&, nlohmann::ordered_json&)> finish = {};
  std::function<void(const nlohmann::json& config, const TransformerSpec&, std::vector<std::string>& out)> check = {};
  // Our name for a tensor of an HF file; "" for what is not a parameter here (buffers,
  // a tied head that is not stored).
  std::function<std::string(const std::string& hf_name)> parameter_name = [](const std::string& n) { return n; };
  std::vector<std::string> transposed = {};  // name endings of weights HF stores [in, out] (GPT-2's Conv1D)
};

struct ModelFamily {
  std::string name;
  // Fills in the spec's family part from the config (its defaults, options); UsageError
  // naming the keys for what the family cannot be. The shapes are set already.
  std::function<void(const ModelConfig&, TransformerSpec&)> configure;
  // Its layers. table_only: the last pipeline stage's copy of a tied head's table.
  std::function<std::unique_ptr<Embedding>(const TransformerSpec&, bool table_only)> embedding;
  std::function<std::unique_ptr<Block>(const TransformerSpec&, int layer)> block;
  std::function<std::unique_ptr<Norm>(const TransformerSpec&)> final_norm;
  std::function<std::unique_ptr<Head>(const TransformerSpec&)> head;
  HfConventions hf;
};

// Registers a family under its name (at static initialization: the family's file holds
// `const bool registered = register_family(...)`); returns true.
bool register_family(ModelFamily family);
// The registered family `name`; UsageError "model.family must be a or b, got 'x'".
const ModelFamily& model_family(const std::string& name);

// The layers of one pipeline stage: the embedding (the first stage's; the last stage's
// copy of a tied head's table), its blocks in the order of its chunks, the final norm
// and the head (the last stage's).
struct StageLayers {
  std::unique_ptr<Embedding> embedding;
  std::vector<std::unique_ptr<Block>> blocks;
  std::unique_ptr<Norm> final_norm;
  std::unique_ptr<Head> head;
};
StageLayers make_stage_layers(const TransformerSpec& spec, const StageSpec& stage);

}  // namespace trident
