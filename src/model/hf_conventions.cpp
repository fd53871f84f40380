#include "model/hf_conventions.h"

#include <cmath>
#include <sstream>

#include "model/families/family.h"

namespace trident {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Calls f(field, our value) for each of the family's config.json fields (numbers).
template <class F>
void for_each_hf_field(const TransformerSpec& spec, F&& f) {
  const HfConventions& hf = model_family(spec.family).hf;
  visit_model_fields(spec.config, [&](const char* key, const auto& value, const char*) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>)
      for (const HfField& field : hf.fields)
        if (std::string(field.key) == key) f(field, static_cast<double>(value));
  });
}

// A field's value in a config.json: its number, 0 for a null HF reads as ours, else `fallback`.
double file_value(const nlohmann::json& c, const HfField& field, double fallback) {
  if (!c.contains(field.hf)) return fallback;
  if (c[field.hf].is_number()) return c[field.hf].get<double>();
  if (c[field.hf].is_boolean()) return c[field.hf].get<bool>() ? 1.0 : 0.0;
  return c[field.hf].is_null() && field.null_is_zero ? 0.0 : fallback;
}

}  // namespace

nlohmann::ordered_json hf_config(const TransformerSpec& s, const std::string& torch_dtype) {
  const HfConventions& hf = model_family(s.family).hf;
  nlohmann::ordered_json c = hf.constants;
  visit_model_fields(s.config, [&](const char* key, const auto& value, const char*) {
    for (const HfField& field : hf.fields) {
      if (std::string(field.key) != key) continue;
      c[field.hf] = value;
      if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>)
        if (field.null_is_zero && value == 0) c[field.hf] = nullptr;
    }
  });
  if (hf.rope_scaling) {
    const RopeScaling& r = s.rope_scaling;
    c["rope_scaling"] = nullptr;
    if (r.type != "none")
      c["rope_scaling"] = {{"rope_type", r.type},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_max_position}};
  }
  if (hf.finish) hf.finish(s, c);
  c["torch_dtype"] = torch_dtype;
  return c;
}

std::vector<std::string> hf_config_mismatches(const nlohmann::json& c, const TransformerSpec& s) {
  const HfConventions& hf = model_family(s.family).hf;
  std::vector<std::string> out;
  const auto number = [&](const nlohmann::json& j, const std::string& field, double fallback) {
    return j.contains(field) && j[field].is_number() ? j[field].get<double>() : fallback;
  };
  const auto expect = [&](const std::string& field, double file, const std::string& key, double model) {
    const bool same = std::abs(file - model) <= 1e-9 * std::max(1.0, std::abs(model));
    if (same) return;
    std::ostringstream m;
    m << field << " = " << file << ", but " << key << " = " << model;
    out.push_back(m.str());
  };
  const std::string type = c.value("model_type", "");
  if (type != hf.constants.value("model_type", ""))
    out.push_back("model_type = '" + type + "', but model.family = " + s.family);
  // A field the file leaves out: HF's default, or another field's value (its default if absent too).
  const auto hf_default = [&](const HfField& field) {
    if (field.default_from == nullptr) return field.hf_default;
    double from = 0;
    for (const HfField& other : hf.fields)
      if (std::string(other.hf) == field.default_from) from = number(c, other.hf, other.hf_default);
    return from * field.default_factor;
  };
  for_each_hf_field(s, [&](const HfField& field, double ours) {
    if (field.required && !c.contains(field.hf)) {
      out.push_back(std::string(field.hf) + " is missing (" + s.family + " needs it: model." + field.key + ")");
      return;
    }
    if (field.checked) expect(field.hf, file_value(c, field, hf_default(field)), std::string("model.") + field.key, ours);
  });
  if (hf.rope_scaling) {
    const bool scaled = c.contains("rope_scaling") && c["rope_scaling"].is_object();
    const std::string rope_type = scaled ? c["rope_scaling"].value("rope_type", c["rope_scaling"].value("type", "")) : "";
    if ((scaled ? rope_type : std::string("none")) != s.rope_scaling.type) {
      out.push_back("rope_scaling = " + (scaled ? rope_type : std::string("null")) + ", but model.rope_scaling = " +
                    s.rope_scaling.type);
    } else if (scaled) {
      const nlohmann::json& r = c["rope_scaling"];
      const RopeScaling& m = s.rope_scaling;
      expect("rope_scaling.factor", number(r, "factor", 8), "model.rope_factor", m.factor);
      expect("rope_scaling.low_freq_factor", number(r, "low_freq_factor", 1), "model.rope_low_freq_factor",
             m.low_freq_factor);
      expect("rope_scaling.high_freq_factor", number(r, "high_freq_factor", 4), "model.rope_high_freq_factor",
             m.high_freq_factor);
      expect("rope_scaling.original_max_position_embeddings", number(r, "original_max_position_embeddings", 8192),
             "model.rope_original_max_position", m.original_max_position);
    }
  }
  if (hf.check) hf.check(c, s, out);
  return out;
}

std::string parameter_name_from_hf(const TransformerSpec& s, const std::string& hf) {
  if (ends_with(hf, ".rotary_emb.inv_freq")) return "";  // a buffer, in any family
  if (s.tied_head && hf == "lm_head.weight") return "";   // some tied files keep the head's copy of the table
  return model_family(s.family).hf.parameter_name(hf);
}

bool hf_stores_transposed(const TransformerSpec& s, const std::string& name) {
  for (const std::string& tail : model_family(s.family).hf.transposed)
    if (ends_with(name, tail)) return true;
  return false;
}

}  // namespace trident
