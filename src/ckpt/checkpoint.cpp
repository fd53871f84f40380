#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_upload.h"
#include "ckpt/hdf5_file.h"
#include "monitor/step_trace.h"
#include "parallel/agreement.h"
#include "runtime/durable_file.h"
#include "runtime/injected_faults.h"
#include "kernels/base/error.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr const char* kFormat = "trident-checkpoint-v1";

std::string node_file_name(int node) {
  char name[32];
  std::snprintf(name, sizeof name, "node_%04d.h5", node);
  return name;
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::replicated: return "replicated";
    case Sharding::rows: return "rows";
    case Sharding::qkv_rows: return "qkv_rows";
    case Sharding::columns: return "columns";
  }
  return "?";
}

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

// One rank's pieces: a JSON header, then the floats of every piece in order.
struct Piece {
  std::string kind, name, sharding;
  std::vector<int64_t> shape;
  int64_t padded_rows = 0, tp_rank = 0, tp_size = 1;
  const float* data = nullptr;
  size_t count = 0;
};

// One kind of this rank's state as a full flat buffer in host memory.
struct KindSource {
  std::string kind;
  const float* flat = nullptr;  // null: for sizes only
};

// The pieces of this rank's state that go into its node's file: its stage's tensors,
// its tp shard, of every kind in `sources`' order. One replica writes for all
// (CheckpointWriter), and of the tp ranks holding the same piece, the one whose copy counts.
std::vector<Piece> rank_pieces(const ParameterLayout& layout, const CheckpointWriter& writer,
                               const std::vector<KindSource>& sources) {
  std::vector<Piece> pieces;
  for (const ParameterTensor& t : layout.tensors()) {
    const Placement& p = t.placement;
    if (!writer.writes(p)) continue;
    for (const KindSource& source : sources)
      pieces.push_back({source.kind, t.name, sharding_name(p.sharding), t.shape, t.padded_shape[0], p.piece, p.pieces,
                        source.flat == nullptr ? nullptr : source.flat + t.offset, t.stored});
  }
  return pieces;
}

// What a checkpoint holds of each tensor, in this order in the node files: the
// parameters, then the optimizer's state buffers (optim/optimizer.h).
std::vector<std::string> kinds_with(const std::vector<std::string>& optimizer_state) {
  std::vector<std::string> kinds = {"params"};
  kinds.insert(kinds.end(), optimizer_state.begin(), optimizer_state.end());
  return kinds;
}
// The optimizer's state buffers' names.
std::vector<std::string> state_names(const ShardedState& state) {
  std::vector<std::string> names;
  for (const ShardedBuffer& buffer : state.optimizer_state) names.push_back(buffer.name);
  return names;
}
std::vector<std::string> kinds_of(const ShardedState& state) { return kinds_with(state_names(state)); }

// A blob: the header's length, the header (JSON), the pieces' floats.
std::string packed_header(const std::vector<Piece>& pieces, size_t& floats) {
  nlohmann::json header = nlohmann::json::array();
  floats = 0;
  for (const Piece& p : pieces) {
    header.push_back({{"kind", p.kind}, {"name", p.name}, {"sharding", p.sharding}, {"shape", p.shape},
                      {"padded_rows", p.padded_rows}, {"tp_rank", p.tp_rank}, {"tp_size", p.tp_size},
                      {"count", p.count}});
    floats += p.count;
  }
  return header.dump();
}

size_t packed_size(const std::vector<Piece>& pieces) {
  size_t floats = 0;
  return sizeof(uint64_t) + packed_header(pieces, floats).size() + floats * sizeof(float);
}

void pack(const std::vector<Piece>& pieces, std::vector<char>& blob) {
  size_t floats = 0;
  const std::string text = packed_header(pieces, floats);
  const uint64_t length = text.size();
  blob.resize(sizeof length + text.size() + floats * sizeof(float));  // keeps its capacity
  std::memcpy(blob.data(), &length, sizeof length);
  std::memcpy(blob.data() + sizeof length, text.data(), text.size());
  char* out = blob.data() + sizeof length + text.size();
  for (const Piece& p : pieces) {
    std::memcpy(out, p.data, p.count * sizeof(float));
    out += p.count * sizeof(float);
  }
}

// Writes a blob's pieces; adds the shards written to `shards`.
void write_blob(Hdf5Writer& file, const std::vector<char>& blob, std::vector<ShardName>& shards) {
  uint64_t length = 0;
  std::memcpy(&length, blob.data(), sizeof length);
  const nlohmann::json header = nlohmann::json::parse(blob.begin() + sizeof length, blob.begin() + sizeof length + length);
  const char* data = blob.data() + sizeof length + length;
  for (const auto& p : header) {
    const size_t count = p["count"];
    const std::string path = "/" + p["kind"].get<std::string>() + "/" + p["name"].get<std::string>() + "/tp" +
                             std::to_string(p["tp_rank"].get<int>()) + "of" + std::to_string(p["tp_size"].get<int>());
    std::vector<float> values(count);
    std::memcpy(values.data(), data, count * sizeof(float));  // aligned copy for HDF5
    data += count * sizeof(float);
    file.write_floats(path, values.data(), {static_cast<int64_t>(count)});
    file.attr(path, "shape", p["shape"].get<std::vector<int64_t>>());
    file.attr(path, "padded_rows", p["padded_rows"].get<int64_t>());
    file.attr(path, "sharding", p["sharding"].get<std::string>());
    file.attr(path, "tp_rank", p["tp_rank"].get<int64_t>());
    file.attr(path, "tp_size", p["tp_size"].get<int64_t>());
    const ShardName shard{p["name"].get<std::string>(), p["tp_rank"].get<int>(), p["tp_size"].get<int>()};
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
}

nlohmann::json shards_json(const std::vector<ShardName>& shards) {
  nlohmann::json j = nlohmann::json::array();
  for (const ShardName& s : shards) j.push_back({s.tensor, s.tp_rank, s.tp_size});
  return j;
}

}  // namespace

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

std::vector<bool> files_needed(const Manifest& m, const ParameterLayout& layout) {
  std::vector<bool> needed(m.files.size(), false);
  for (const ManifestFile& f : m.files)
    if (f.shards.empty()) return std::vector<bool>(m.files.size(), true);  // an older manifest: all
  for (const ParameterTensor& t : layout.tensors()) {
    // Its own shard, saved under the same tp: that file alone. Else every shard of it.
    const ShardName own{t.name, t.placement.piece, t.placement.pieces};
    bool found = false;
    for (size_t i = 0; i < m.files.size() && !found; i++)
      if (std::find(m.files[i].shards.begin(), m.files[i].shards.end(), own) != m.files[i].shards.end())
        needed[i] = found = true;
    if (found) continue;
    for (size_t i = 0; i < m.files.size(); i++)
      for (const ShardName& s : m.files[i].shards)
        if (s.tensor == t.name) needed[i] = true;
  }
  return needed;
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

std::optional<Manifest> find_latest_checkpoint(const std::string& dir, bool quiet) {
  std::vector<std::string> candidates = complete_checkpoints(dir);
  std::ifstream latest((fs::path(dir) / "latest").string());
  std::string named;
  if (latest >> named) {
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

namespace {

// Where every shard of every tensor of a checkpoint is; the node files stay open.
struct ShardIndex {
  struct Location {
    const Hdf5Reader* file;
    std::string dataset;
    int tp_rank, tp_size;
  };
  std::vector<std::unique_ptr<Hdf5Reader>> files;
  std::map<std::pair<std::string, std::string>, std::vector<Location>> shards;  // (kind, name) -> shards

  // needed: the files to open (files_needed); empty: all.
  explicit ShardIndex(const Manifest& m, const std::vector<bool>& needed = {}) {
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

  // The dataset of one shard, if the checkpoint has it.
  const Location* find(const std::string& kind, const std::string& name, int tp_rank, int tp_size) const {
    const auto it = shards.find({kind, name});
    if (it == shards.end()) return nullptr;
    for (const Location& l : it->second)
      if (l.tp_rank == tp_rank && l.tp_size == tp_size) return &l;
    return nullptr;
  }

  // The full canonical tensor, assembled from its shards with the saved layout.
  std::vector<float> canonical(const Manifest& m, const ParameterLayout& saved, const std::string& kind,
                               const std::string& name) const {
    const auto it = shards.find({kind, name});
    require(it != shards.end(), m.dir + ": the checkpoint holds no " + kind + " of " + name);
    const ParameterTensor& t = saved.tensor(name);
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
};

}  // namespace

std::vector<std::pair<std::string, std::vector<float>>> read_canonical(const Manifest& m, const std::string& kind) {
  const ShardIndex index(m);
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const ParameterLayout whole(m.model);
  for (const ParameterTensor& t : whole.tensors()) out.emplace_back(t.name, index.canonical(m, saved, kind, t.name));
  return out;
}

// ---- writing ------------------------------------------------------------------------

struct Checkpointer::Pending {
  int step = 0;
  std::string dir;                 // the step directory
  std::thread writer;
  std::atomic<bool> written{false};
  std::string error;               // set by the writer on failure
  ManifestFile file;               // the node leader's, with the shards it holds
  Timer since_start;
};

Checkpointer::Checkpointer(const Config& config, ParallelState& parallel, ShardedState state)
    : config_(config), parallel_(parallel), state_(std::move(state)) {
  // This node's file number: the number of node leaders before it.
  std::vector<double> leaders(parallel.world().size(), 0.0);
  leaders[parallel.rank()] = parallel.node().rank() == 0 ? 1.0 : 0.0;
  parallel.world().all_reduce(std::span<double>(leaders));
  for (int r = 0; r < parallel.rank(); r++) node_index_ += static_cast<int>(leaders[r]);
  // Touch every host buffer of a save now, once: fresh pages are slow here, and the
  // first checkpoint should stall training no longer than the later ones.
  if (!config.checkpoint.dir.empty()) collect_at_node_leader(0);
  if (!config.checkpoint.upload.empty()) uploader_ = std::make_unique<CheckpointUploader>(config, parallel);
}

size_t Checkpointer::staging_bytes(const ParameterLayout& layout, const std::vector<std::string>& optimizer_state) {
  return (1 + optimizer_state.size()) * layout.total_floats() * sizeof(float);
}

size_t Checkpointer::piece_bytes(const ParameterLayout& layout, const CheckpointWriter& writer,
                                 const std::vector<std::string>& optimizer_state) {
  std::vector<KindSource> sizes_only;
  for (const std::string& kind : kinds_with(optimizer_state)) sizes_only.push_back({kind});
  return packed_size(rank_pieces(layout, writer, sizes_only));
}

size_t Checkpointer::leader_buffer_bytes(const ParameterLayout& layout) {
  size_t largest = 0;
  for (const ParameterTensor& t : layout.tensors()) largest = std::max(largest, t.stored);
  return kCrcBufferBytes + largest * sizeof(float);
}

void Checkpointer::collect_at_node_leader(int step) {
  // 1. This rank's pieces: its stage's tensors, its tp shard; parameters and optimizer state
  //    in full (ZeRO gathers the sharded ones over dp first).
  const ParameterLayout& layout = *state_.parameters.layout;
  const size_t n = layout.total_floats();
  host_state_.resize(1 + state_.optimizer_state.size());
  for (std::vector<float>& buffer : host_state_) buffer.resize(n);
  state_.parameters.to_host(host_state_[0].data());
  if (state_.parameters.sharded()) state_.gather_shards(host_state_[0].data());  // ZeRO-3
  for (size_t i = 0; i < state_.optimizer_state.size(); i++) {
    state_.optimizer_state[i].to_host(host_state_[1 + i].data());
    state_.gather_shards(host_state_[1 + i].data());
  }
  const std::vector<std::string> kinds = kinds_of(state_);
  std::vector<KindSource> sources;
  for (size_t i = 0; i < kinds.size(); i++) sources.push_back({kinds[i], host_state_[i].data()});
  // One replica of each tensor writes it.
  const std::vector<Piece> pieces =
      rank_pieces(layout, CheckpointWriter{parallel_.dims(), parallel_.coords()}, sources);
  // 2. Hand them to the node leader, in messages below 1 GiB. The buffers keep their
  //    memory between saves.
  Communicator& node = parallel_.node();
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  node_blobs_.resize(node.rank() == 0 ? node.size() : 1);
  pack(pieces, node_blobs_[0]);
  if (node.rank() == 0) {
    for (int r = 1; r < node.size(); r++) {
      uint64_t size = 0;
      node.recv(std::as_writable_bytes(std::span(&size, 1)), r, 0);
      std::vector<char>& other = node_blobs_[r];
      other.resize(size);
      for (uint64_t done = 0; done < size; done += kChunk)
        node.recv(std::as_writable_bytes(std::span(other.data() + done, std::min(size - done, kChunk))), r, 1);
    }
  } else {
    const std::vector<char>& blob = node_blobs_[0];
    const uint64_t size = blob.size();
    injected_faults::while_handing_pieces(parallel_.rank(), step);
    node.send(std::as_bytes(std::span(&size, 1)), 0, 0);
    for (uint64_t done = 0; done < size; done += kChunk)
      node.send(std::as_bytes(std::span(blob.data() + done, std::min(size - done, kChunk))), 0, 1);
  }
}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

void Checkpointer::save(int step) {
  const trace::Span span("checkpoint", [&] { return "checkpoint save, step " + std::to_string(step); });
  if (pending_) {
    Timer waiting;
    const int previous = pending_->step;
    finish();
    if (parallel_.is_root())
      std::printf("checkpoint: step %d waited %.2f s for the checkpoint of step %d to finish writing\n", step,
                  waiting.seconds(), previous);
  }
  Timer stall;
  auto p = std::make_unique<Pending>();
  p->step = step;
  p->dir = (fs::path(config_.checkpoint.dir) / step_name(step)).string();
  collect_at_node_leader(step);
  Communicator& node = parallel_.node();
  if (parallel_.is_root()) fs::create_directories(p->dir);
  parallel_.world().barrier();  // the directory exists before any leader writes
  // 3. The leader writes the node file, in the background with async.
  pending_ = std::move(p);
  if (node.rank() == 0) {
    if (config_.checkpoint.async) pending_->writer = std::thread([this] { write_node_file(*pending_); });
    else write_node_file(*pending_);
  } else {
    pending_->written = true;
  }
  last_stall_s_ = stall.seconds();
  if (!config_.checkpoint.async) {
    finish();
    last_stall_s_ = stall.seconds();
  }
}

void Checkpointer::write_node_file(Pending& p) {
  const trace::Span span("checkpoint", [&] { return "write node file, step " + std::to_string(p.step); });
  const std::string name = node_file_name(node_index_);
  const std::string path = (fs::path(p.dir) / name).string(), tmp = path + ".tmp";
  try {
    Hdf5Writer file(tmp);
    file.attr("/", "format", std::string(kFormat));
    file.attr("/", "step", static_cast<int64_t>(p.step));
    std::vector<ShardName> shards;
    for (const auto& blob : node_blobs_) {
      write_blob(file, blob, shards);
      injected_faults::while_writing_node_file(p.step);
    }
    file.close();
    sync_path(tmp);
    fs::rename(tmp, path);
    p.file = {name, fs::file_size(path), file_crc32(path), std::move(shards)};
  } catch (const std::exception& e) {
    p.error = e.what();
    std::error_code ignored;
    fs::remove(tmp, ignored);
  }
  p.written = true;
}

bool Checkpointer::poll() {
  if (uploader_) uploader_->poll();
  if (!pending_) return false;
  const double written = parallel_.world().all_reduce(pending_->written ? 1.0 : 0.0, ReduceOp::sum);
  if (written < parallel_.world().size()) return false;
  complete(*pending_);
  pending_.reset();
  return true;
}

void Checkpointer::finish() {
  if (!pending_) return;
  if (pending_->writer.joinable()) pending_->writer.join();
  complete(*pending_);
  pending_.reset();
}

void Checkpointer::complete(Pending& p) {
  if (p.writer.joinable()) p.writer.join();
  // Every leader reports its file (or its error) to rank 0.
  const bool leader = parallel_.node().rank() == 0;
  nlohmann::json report = leader ? nlohmann::json{{"name", p.file.name}, {"bytes", p.file.bytes}, {"crc32", p.file.crc32},
                                                  {"shards", shards_json(p.file.shards)}, {"error", p.error}}
                                 : nlohmann::json(nullptr);
  // Through the world communicator, so that a rank that died leaves no one waiting
  // past parallel.timeout_s.
  Communicator& world = parallel_.world();
  const std::vector<std::string> reports = world.gather_strings(report.dump());
  std::string error, manifest_text;
  if (parallel_.is_root()) {
    nlohmann::json files = nlohmann::json::array();
    for (const std::string& r : reports) {
      const auto j = nlohmann::json::parse(r);
      if (j.is_null()) continue;
      if (!j["error"].get<std::string>().empty()) error += j["error"].get<std::string>() + "; ";
      files.push_back({{"name", j["name"]}, {"bytes", j["bytes"]}, {"crc32", j["crc32"]}, {"shards", j["shards"]}});
    }
    if (error.empty()) {
      try {
        injected_faults::before_manifest(p.step);
        const auto& par = config_.parallel;
        const nlohmann::json manifest = {
            {"format", kFormat},
            {"step", p.step},
            {"model", model_json(config_.model)},
            {"layout", {{"dp", parallel_.size(Axis::dp)}, {"tp", parallel_.size(Axis::tp)}, {"pp", parallel_.size(Axis::pp)},
                        {"cp", parallel_.size(Axis::cp)}, {"ep", parallel_.dims().size(MeshAxis::ep)},
                        {"zero", par.zero}, {"nodes", parallel_.nodes()}}},
            {"state", {{"optimizer", state_.optimizer}, {"optimizer_state", state_names(state_)},
                       {"optimizer_steps", p.step}, {"data_position", p.step}, {"lr_schedule_step", p.step},
                       {"seed", config_.train.seed}, {"loss_scale", 1.0}}},
            // The sampler is a function of (seed, step): the step is the data position.
            {"data", {{"fingerprint", data_fingerprint_}, {"position", p.step}}},
            {"config", config_.to_ini()},
            {"files", files}};
        manifest_text = manifest.dump(2);
        write_text_atomically((fs::path(p.dir) / "manifest.json").string(), manifest_text);
        write_text_atomically((fs::path(config_.checkpoint.dir) / "latest").string(), step_name(p.step) + "\n");
        // Only now that the new one is complete: prune the oldest beyond keep_last (but
        // one whose node files are still going to S3).
        const std::vector<std::string> complete = complete_checkpoints(config_.checkpoint.dir);
        const int keep = config_.checkpoint.keep_last;
        for (size_t i = 0; keep > 0 && i + keep < complete.size(); i++)
          if (uploader_ == nullptr || !uploader_->in_use(complete[i])) fs::remove_all(complete[i]);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!error.empty()) {
      std::error_code ignored;
      fs::remove_all(p.dir, ignored);  // the previous checkpoint stays the latest
    }
  }
  // Every rank learns the verdict: a failed save is one clear error on every rank.
  uint64_t failed = error.size();
  world.broadcast(std::as_writable_bytes(std::span(&failed, 1)), 0);
  if (failed > 0) {
    error.resize(failed);
    world.broadcast(std::as_writable_bytes(std::span(error.data(), failed)), 0);
    throw AgreedUsageError("saving the checkpoint of step " + std::to_string(p.step) + " failed, the previous one is kept: " + error);
  }
  if (parallel_.is_root())
    std::printf("checkpoint: step %d saved to %s (%.2f s from its start)\n", p.step, p.dir.c_str(), p.since_start.seconds());
  if (uploader_) uploader_->submit(p.step, p.dir, leader ? p.file : ManifestFile{}, manifest_text);
}

// ---- loading ------------------------------------------------------------------------

int Checkpointer::load(const Manifest& m) {
  const ParameterLayout& layout = *state_.parameters.layout;
  require_same_model(m.model, config_.model, "checkpoint " + m.dir);
  // init_from reads a trident checkpoint as it is (its parameters alone); in a new folder,
  // since this one would resume from the same checkpoint again.
  const std::string start_anew = "start from its parameters: --checkpoint.init_from=" + m.dir +
                                 " with another --checkpoint.dir (this one resumes)";
  require(m.optimizer == state_.optimizer,
          "checkpoint " + m.dir + " holds the state of the optimizer " + m.optimizer + ", not of train.optimizer = " +
              state_.optimizer + "; to change optimizers, " + start_anew);
  require(m.data_fingerprint.empty() || data_fingerprint_.empty() || m.data_fingerprint == data_fingerprint_,
          "checkpoint " + m.dir + " was trained on other data (" + m.data_fingerprint + ") than data.path holds now (" +
              data_fingerprint_ + "), so its data position means nothing here; to train on new data, " + start_anew);
  const ShardIndex index(m, files_needed(m, layout));
  const ParameterLayout saved(m.model, 0, m.dims.size(Axis::tp));
  const std::vector<std::string> kinds = kinds_of(state_);
  std::vector<std::vector<float>> full(kinds.size(), std::vector<float>(layout.total_floats(), 0.0f));
  for (const ParameterTensor& t : layout.tensors())
    for (size_t k = 0; k < kinds.size(); k++) {
      // The same piece saved: this rank's shard is a dataset of its own. Otherwise
      // assemble the full tensor from the saved shards and cut the new shard from it.
      if (const auto* own = index.find(kinds[k], t.name, t.placement.piece, t.placement.pieces)) {
        const std::vector<float> shard = own->file->read_float(own->dataset);
        require(shard.size() == t.stored, own->file->path() + ": " + own->dataset + " has the wrong size");
        std::copy(shard.begin(), shard.end(), full[k].begin() + t.offset);
        continue;
      }
      const std::vector<float> canonical = index.canonical(m, saved, kinds[k], t.name);
      const std::vector<float> shard = layout.shard_of(t, canonical.data());
      std::copy(shard.begin(), shard.end(), full[k].begin() + t.offset);
    }
  state_.parameters.from_host(full[0].data());
  state_.parameters.changed();
  for (size_t i = 0; i < state_.optimizer_state.size(); i++) state_.optimizer_state[i].from_host(full[1 + i].data());
  state_.set_optimizer_steps(m.step);
  return m.step;
}

void Checkpointer::upload_if_missing(const Manifest& m, const std::string& manifest_text) {
  if (!uploader_) return;
  std::string why_not;  // rank 0: empty to upload
  bool upload = false;
  run_collectively([&] {
    if (!parallel_.is_root()) return;
    const std::optional<std::string>& latest = uploader_->s3_latest();
    if (latest && step_of_name(*latest) >= m.step) return;  // S3 has it, or newer
    if (m.nodes != parallel_.nodes())
      why_not = "it was saved on " + std::to_string(m.nodes) + " node(s), this run has " +
                std::to_string(parallel_.nodes());
    upload = why_not.empty();
  });
  why_not = broadcast_string(why_not);
  upload = parallel_.world().all_reduce(upload ? 1.0 : 0.0, ReduceOp::max) > 0;
  if (!why_not.empty() && parallel_.is_root())
    std::printf("checkpoint: step %d is not in S3 and is not uploaded now (%s); the next checkpoint will be\n", m.step,
                why_not.c_str());
  if (!upload) return;
  if (parallel_.is_root())
    std::printf("checkpoint: step %d is newer than S3's latest: uploading it\n", m.step);
  // Node leader i uploads node file i, as the saving run's leader i wrote it.
  const bool leader = parallel_.node().rank() == 0;
  ManifestFile file;
  if (leader && node_index_ < static_cast<int>(m.files.size())) file = m.files[node_index_];
  uploader_->submit(m.step, m.dir, file, manifest_text);
}

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
