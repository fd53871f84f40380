// How Hugging Face's transformers stores a model of ours (DATA_FORMATS.md section 4), by
// its family's conventions (model/families/family.h: HfConventions): config.json from the
// config's keys (config/config.h's visit_model_fields) and back, tensor names (ours are
// HF's; GPT-2 files may prefix "transformer."), weights HF stores [in, out] (GPT-2's
// Conv1D), buffers that are not parameters, a tied head that is not stored.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/transformer_spec.h"

namespace trident {

// config.json for the model; `torch_dtype` "float32" or "bfloat16".
nlohmann::ordered_json hf_config(const TransformerSpec& spec, const std::string& torch_dtype);
// The fields of a config.json that disagree with the model, each "field = file value, but
// key = model value"; empty when they agree. Fields the file leaves out take HF's defaults.
std::vector<std::string> hf_config_mismatches(const nlohmann::json& config, const TransformerSpec& spec);
// Our name for a tensor of an HF file; "" for what is not a parameter here (buffers
// such as attn.bias, attn.masked_bias, rotary_emb.inv_freq, and GPT-2's tied lm_head.weight).
std::string parameter_name_from_hf(const TransformerSpec& spec, const std::string& hf_name);
// True where HF stores the tensor [in, out]: GPT-2's four Conv1D weights per block.
bool hf_stores_transposed(const TransformerSpec& spec, const std::string& name);

}  // namespace trident
