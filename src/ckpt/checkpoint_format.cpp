#include "ckpt/checkpoint_format.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/base/error.h"
#include "runtime/durable_file.h"
#include "runtime/injected_faults.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr const char* kFormat = "trident-checkpoint-v1";

constexpr size_t kCrcBufferBytes = 8 << 20;

uint32_t file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(kCrcBufferBytes);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (in) {
    in.read(buffer.data(), buffer.size());
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), static_cast<uInt>(in.gcount()));
  }
  return static_cast<uint32_t>(crc);
}

// Writes one piece as its dataset; adds its shard to `shards`.
void write_piece(Hdf5Writer& file, const Piece& p, std::vector<ShardName>& shards) {
  const std::string path = "/" + p.kind + "/" + p.name + "/tp" + std::to_string(p.tp_rank) + "of" + std::to_string(p.tp_size);
  std::vector<float> values(p.count);
  std::memcpy(values.data(), p.data, p.count * sizeof(float));  // aligned copy for HDF5
  file.write_floats(path, values.data(), {static_cast<int64_t>(p.count)});
  file.attr(path, "shape", p.shape);
  file.attr(path, "padded_rows", p.padded_rows);
  file.attr(path, "sharding", p.sharding);
  file.attr(path, "tp_rank", p.tp_rank);
  file.attr(path, "tp_size", p.tp_size);
  const ShardName shard{p.name, static_cast<int>(p.tp_rank), static_cast<int>(p.tp_size)};
  if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
}

}  // namespace

nlohmann::json shards_json(const std::vector<ShardName>& shards) {
  nlohmann::json j = nlohmann::json::array();
  for (const ShardName& s : shards) j.push_back({s.tensor, s.tp_rank, s.tp_size});
  return j;
}

std::string node_file_name(int node) {
  char name[32];
  std::snprintf(name, sizeof name, "node_%04d.h5", node);
  return name;
}

std::string step_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  return name;
}

int step_of_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  return std::atoi(name.c_str() + 5);
}

namespace {

// A model field as JSON, and back (a choice by its name).
template <class T>
nlohmann::json json_of(const T& value) {
  if constexpr (std::is_enum_v<T>) return name_of(value);
  else return value;
}
template <class T>
void from_json_value(const nlohmann::json& j, T& value) {
  if constexpr (std::is_enum_v<T>) value = parse_choice<T>(j.get<std::string>());
  else value = j.get<T>();
}

}  // namespace

nlohmann::json model_json(const ModelConfig& m) {
  nlohmann::json j = nlohmann::json::object();
  visit_model_fields(m, [&j](const char* key, const auto& field, const char*) { j[key] = json_of(field); });
  return j;
}

ModelConfig model_from_json(const nlohmann::json& j) {
  for (const char* shape : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) j.at(shape);  // the rest: defaults
  ModelConfig m;  // a field an older file lacks keeps its default
  visit_model_fields(m, [&j](const char* key, auto& field, const char*) {
    if (j.contains(key)) from_json_value(j.at(key), field);
  });
  return m;
}

void require_same_model(const ModelConfig& saved, const ModelConfig& configured, const std::string& what) {
  const TransformerSpec a = transformer_spec(saved), b = transformer_spec(configured);
  std::string keys;
  const auto differ = [&](bool different, const char* key) {
    if (different) keys += std::string(keys.empty() ? "" : ", ") + "model." + key;
  };
  differ(a.family != b.family, "family");
  differ(a.n_layer != b.n_layer, "n_layer");
  differ(a.n_head != b.n_head, "n_head");
  differ(a.n_kv_head != b.n_kv_head, "n_kv_head");
  differ(a.d_model != b.d_model, "d_model");
  differ(a.head_dim != b.head_dim, "head_dim");
  differ(a.tied_head != b.tied_head, "tie_word_embeddings");
  differ(a.ffn_dim != b.ffn_dim, "ffn_dim");
  differ(a.seq_len != b.seq_len, "seq_len");
  differ(a.vocab_size != b.vocab_size, "vocab_size");
  require(keys.empty(), what + " holds a model " + a.describe() + ", not the configured " + b.describe() + " (" +
                            keys + ")");
}

// ---- reading ------------------------------------------------------------------------

Manifest parse_manifest(const std::string& text, const std::string& step_dir, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(path + ": not valid JSON (" + e.what() + ")");
  }
  require(j.value("format", "") == kFormat, path + ": format is not " + kFormat);
  Manifest m;
  m.dir = step_dir;
  try {
    m.step = j.at("step");
    m.model = model_from_json(j.at("model"));
    const auto& layout = j.at("layout");
    const int dp = layout.at("dp"), pp = layout.at("pp"), tp = layout.at("tp"), cp = layout.value("cp", 1);
    m.dims = ParallelDims::resolve(dp * pp * tp * cp, {{Axis::dp, dp}, {Axis::pp, pp}, {Axis::cp, cp}, {Axis::tp, tp}});
    m.dims.set_ep(layout.value("ep", 1));
    m.zero = layout.at("zero");
    m.nodes = layout.at("nodes");
    m.config_ini = j.value("config", "");
    if (j.contains("state") && j["state"].contains("optimizer")) {  // older checkpoints: AdamW's
      m.optimizer = j["state"]["optimizer"];
      m.optimizer_state = j["state"].at("optimizer_state");
    }
    if (j.contains("data")) m.data_fingerprint = j["data"].value("fingerprint", "");
    for (const auto& f : j.at("files")) {
      ManifestFile file{f.at("name"), f.at("bytes"), f.at("crc32"), {}};
      require(file.name.find('/') == std::string::npos && file.name != ".." && !file.name.empty(),
              path + ": a file name with a '/' (" + file.name + ")");
      if (f.contains("shards"))
        for (const auto& s : f["shards"]) file.shards.push_back({s.at(0), s.at(1), s.at(2)});
      m.files.push_back(std::move(file));
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": missing or malformed field (" + e.what() + ")");
  } catch (const UsageError& e) {  // a family or a layout that cannot be
    throw UsageError(path + ": " + e.what());
  }
  return m;
}

void verify_node_file(const std::string& file, const ManifestFile& f) {
  require(fs::exists(file), file + " is missing");
  require(fs::file_size(file) == f.bytes, file + " has " + std::to_string(fs::file_size(file)) +
                                              " bytes, the manifest says " + std::to_string(f.bytes) + " (truncated?)");
  require(file_crc32(file) == f.crc32, file + " does not match its CRC-32 in the manifest (corrupted)");
}

Manifest read_manifest(const std::string& step_dir, bool verify_files) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  std::ifstream in(path);
  require(in.good(), "checkpoint '" + step_dir + "' is incomplete: no manifest.json");
  std::stringstream text;
  text << in.rdbuf();
  Manifest m = parse_manifest(text.str(), step_dir, path);
  if (!verify_files) return m;
  for (const ManifestFile& f : m.files) {
    const std::string file = (fs::path(step_dir) / f.name).string();
    require(fs::exists(file), path + " names " + f.name + ", which is missing");
    verify_node_file(file, f);
  }
  return m;
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  std::vector<std::string> steps;
  if (!fs::is_directory(dir)) return steps;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("step_") && fs::exists(e.path() / "manifest.json"))
      steps.push_back(e.path().string());
  std::sort(steps.begin(), steps.end());  // zero-padded step numbers sort in order
  return steps;
}

std::string latest_name(const std::string& dir) {
  std::string named;
  std::ifstream((fs::path(dir) / "latest").string()) >> named;
  return named;
}

std::optional<Manifest> find_latest_checkpoint(const std::string& dir, bool quiet) {
  std::vector<std::string> candidates = complete_checkpoints(dir);
  if (const std::string named = latest_name(dir); !named.empty()) {
    const std::string path = (fs::path(dir) / named).string();
    candidates.erase(std::remove(candidates.begin(), candidates.end(), path), candidates.end());
    candidates.push_back(path);  // tried first
  }
  std::string problems;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    try {
      Manifest m = read_manifest(*it);
      if (!problems.empty() && !quiet)
        std::fprintf(stderr, "trident: warning: %sfalling back to the complete checkpoint %s\n", problems.c_str(), it->c_str());
      return m;
    } catch (const UsageError& e) {
      problems += std::string(e.what()) + "; ";
    }
  }
  if (!problems.empty()) throw UsageError("no loadable checkpoint in '" + dir + "': " + problems);
  return std::nullopt;
}

ShardIndex::ShardIndex(const Manifest& m, const std::vector<bool>& needed) {
  for (size_t i = 0; i < m.files.size(); i++) {
    if (!needed.empty() && !needed[i]) continue;
    const ManifestFile& f = m.files[i];
    files.push_back(std::make_unique<Hdf5Reader>((fs::path(m.dir) / f.name).string()));
    const Hdf5Reader& file = *files.back();
    for (const std::string& kind : file.members("/")) {  // params and the optimizer's state
      for (const std::string& name : file.members("/" + kind))
        for (const std::string& shard : file.members("/" + kind + "/" + name)) {
          const std::string dataset = "/" + kind + "/" + name + "/" + shard;
          shards[{kind, name}].push_back({&file, dataset, static_cast<int>(file.attr_int(dataset, "tp_rank")),
                                          static_cast<int>(file.attr_int(dataset, "tp_size"))});
        }
    }
  }
}

const ShardIndex::Location* ShardIndex::find(const std::string& kind, const std::string& name, int tp_rank,
                                             int tp_size) const {
  const auto it = shards.find({kind, name});
  if (it == shards.end()) return nullptr;
  for (const Location& l : it->second)
    if (l.tp_rank == tp_rank && l.tp_size == tp_size) return &l;
  return nullptr;
}

std::vector<float> ShardIndex::canonical(const Manifest& m, const ParameterLayout& saved, const std::string& kind,
                                         const std::string& name) const {
  const auto it = shards.find({kind, name});
  require(it != shards.end(), m.dir + ": the checkpoint holds no " + kind + " of " + name);
  const ParameterTensor* buffer = saved.find_buffer(name);
  const ParameterTensor& t = buffer != nullptr ? *buffer : saved.tensor(name);
  const int pieces = t.placement.pieces;
  std::vector<float> all(t.stored * pieces);
  std::vector<bool> seen(pieces, false);
  for (const Location& l : it->second) {
    const std::vector<float> data = l.file->read_float(l.dataset);
    require(data.size() == t.stored && l.tp_rank < pieces, l.file->path() + ": " + l.dataset + " has the wrong size");
    std::copy(data.begin(), data.end(), all.begin() + l.tp_rank * t.stored);
    seen[l.tp_rank] = true;
  }
  require(std::all_of(seen.begin(), seen.end(), [](bool s) { return s; }), m.dir + ": shards of " + name + " are missing");
  return saved.assemble(t, all);
}

std::vector<std::pair<std::string, std::vector<float>>> read_canonical(const Manifest& m, const std::string& kind) {
  const ShardIndex index(m);
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const ParameterLayout whole(m.model);
  for (const ParameterTensor& t : whole.tensors()) out.emplace_back(t.name, index.canonical(m, saved, kind, t.name));
  return out;
}

// ---- writing ------------------------------------------------------------------------

ManifestFile write_node_file(const std::string& step_dir, const std::string& name, int step,
                             const std::vector<std::vector<Piece>>& pieces_of_ranks) {
  const std::string path = (fs::path(step_dir) / name).string(), tmp = path + ".tmp";
  try {
    Hdf5Writer file(tmp);
    file.attr("/", "format", std::string(kFormat));
    file.attr("/", "step", static_cast<int64_t>(step));
    std::vector<ShardName> shards;
    for (const std::vector<Piece>& pieces : pieces_of_ranks) {
      for (const Piece& p : pieces) write_piece(file, p, shards);
      injected_faults::while_writing_node_file(step);
    }
    file.close();
    sync_path(tmp);
    fs::rename(tmp, path);
    return {name, fs::file_size(path), file_crc32(path), std::move(shards)};
  } catch (const std::exception&) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

size_t node_file_writer_bytes(const ParameterLayout& layout) {
  size_t largest = 0;
  for (const ParameterTensor& t : layout.tensors()) largest = std::max(largest, t.stored);
  return kCrcBufferBytes + largest * sizeof(float);
}

std::string manifest_text(const Config& config, const ParallelState& parallel, int step, const std::string& optimizer,
                          const std::vector<std::string>& optimizer_state, const std::string& data_fingerprint,
                          const nlohmann::json& files) {
  const auto& par = config.parallel;
  const nlohmann::json manifest = {
      {"format", kFormat},
      {"step", step},
      {"model", model_json(config.model)},
      {"layout", {{"dp", parallel.size(Axis::dp)}, {"tp", parallel.size(Axis::tp)}, {"pp", parallel.size(Axis::pp)},
                  {"cp", parallel.size(Axis::cp)}, {"ep", parallel.dims().size(MeshAxis::ep)},
                  {"zero", par.zero}, {"nodes", parallel.nodes()}}},
      {"state", {{"optimizer", optimizer}, {"optimizer_state", optimizer_state},
                 {"optimizer_steps", step}, {"data_position", step}, {"lr_schedule_step", step},
                 {"seed", config.train.seed}, {"loss_scale", 1.0}}},
      // The sampler is a function of (seed, step): the step is the data position.
      {"data", {{"fingerprint", data_fingerprint}, {"position", step}}},
      {"config", config.to_ini()},
      {"files", files}};
  return manifest.dump(2);
}

void commit_checkpoint(const std::string& checkpoint_dir, const std::string& step_dir, int step,
                       const std::string& manifest_text) {
  write_text_atomically((fs::path(step_dir) / "manifest.json").string(), manifest_text);
  write_text_atomically((fs::path(checkpoint_dir) / "latest").string(), step_name(step) + "\n");
}

void prune_checkpoints(const std::string& dir, int keep_last, const std::function<bool(const std::string&)>& in_use) {
  const std::vector<std::string> complete = complete_checkpoints(dir);
  for (size_t i = 0; keep_last > 0 && i + keep_last < complete.size(); i++)
    if (!in_use(complete[i])) fs::remove_all(complete[i]);
}

// ---- exports and init_from ------------------------------------------------------------

std::optional<Manifest> trident_checkpoint_at(const std::string& path) {
  if (!fs::is_directory(path)) return std::nullopt;
  if (fs::exists(fs::path(path) / "manifest.json")) return read_manifest(path);
  if (fs::exists(fs::path(path) / "latest") || !complete_checkpoints(path).empty()) {
    std::optional<Manifest> m = find_latest_checkpoint(path);
    require(m.has_value(), "checkpoint folder '" + path + "' holds no complete checkpoint");
    return m;
  }
  return std::nullopt;
}

void init_parameters_from_checkpoint(const ShardedParameters& parameters, const ModelConfig& configured,
                                     const Manifest& m) {
  require_same_model(m.model, configured, "checkpoint " + m.dir);
  const ShardIndex index(m);
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  for (const ParameterTensor& t : parameters.layout->tensors()) {  // one full tensor at a time
    const std::vector<float> canonical = index.canonical(m, saved, "params", t.name);
    parameters.set(t, canonical.data());
  }
  parameters.changed();
}

void init_parameters_from(const ShardedParameters& parameters, const std::string& path) {
  Hdf5Reader file(path);
  if (file.has_attr("model"))
    require(file.attr_string("model") == parameters.layout->spec().family,
            path + " holds a " + file.attr_string("model") + " model, not the configured " +
                parameters.layout->spec().family + " (model.family)");
  for (const ParameterTensor& t : parameters.layout->tensors()) {
    const std::string name = "params/" + t.name;
    require(file.has(name), path + ": missing " + name + " (a model of another family or shape?)");
    require(file.shape(name) == t.shape, path + ": " + name + " has the wrong shape for this model");
    const std::vector<float> values = file.read_float(name);
    parameters.set(t, values.data());
  }
  parameters.changed();
}

void export_checkpoint(const Manifest& m, const std::string& out) {
  Hdf5Writer file(out);
  file.attr("/", "format", std::string("trident-export-v1"));
  file.attr("/", "model", m.model.family);
  file.attr("/", "step", static_cast<int64_t>(m.step));
  file.attr("/", "config", model_json(m.model).dump());
  for (const auto& [key, value] : std::vector<std::pair<const char*, int>>{
           {"n_layer", m.model.n_layer}, {"n_head", m.model.n_head}, {"d_model", m.model.d_model},
           {"seq_len", m.model.seq_len}, {"vocab_size", m.model.vocab_size}})
    file.attr("/", key, static_cast<int64_t>(value));
  const ParameterLayout layout(m.model);
  for (const auto& [name, values] : read_canonical(m, "params"))
    file.write_floats("/params/" + name, values.data(), layout.tensor(name).shape);
  file.close();
}

}  // namespace trident
