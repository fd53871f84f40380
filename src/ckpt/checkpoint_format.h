// A checkpoint on disk (DESIGN.md):
//   <dir>/step_00001000/node_0000.h5 ... node_NNNN.h5   one file per node, written by its leader
//   <dir>/step_00001000/manifest.json                     step, layout, config, files, checksums
//   <dir>/latest                                          name of the newest complete step dir
// Every piece is a canonical tensor's shard: the dataset /<kind>/<name>/tp<r>of<P> (kind:
// params, or a state buffer of the optimizer: AdamW's exp_avg and exp_avg_sq, Lion's
// exp_avg) holds tp shard r of P, flat, with the tensor's global shape and sharding as
// attributes, so a checkpoint loads under any (dp, tp, pp) and with ZeRO on or off.
//
// Durability: files are written under temporary names, synced, renamed; manifest.json
// is renamed into place only after every node file is complete, and `latest` last. A
// step directory without manifest.json does not count, so a crash at any instant leaves
// the previous checkpoint loadable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/hdf5_file.h"
#include "config/config.h"
#include "model/parameters.h"
#include "parallel/parallel_state.h"

namespace trident {

// One shard a node file holds: a tensor's tp shard `tp_rank` of `tp_size`.
struct ShardName {
  std::string tensor;
  int tp_rank = 0, tp_size = 1;
  auto operator<=>(const ShardName&) const = default;
};

struct ManifestFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::vector<ShardName> shards;  // empty in older manifests: then every file is read
};

// A complete checkpoint's description (manifest.json).
struct Manifest {
  std::string dir;  // the step directory
  int step = 0;
  ModelConfig model;
  ParallelDims dims;
  int zero = 0, nodes = 1;
  std::string config_ini;
  std::string data_fingerprint;  // of the training data (empty in older checkpoints)
  // The optimizer whose state it holds, and its state buffers' names (older: AdamW's).
  std::string optimizer = "adamw";
  std::vector<std::string> optimizer_state = {"exp_avg", "exp_avg_sq"};
  std::vector<ManifestFile> files;
};

// One dataset of a node file: a kind's tp shard of a tensor, its attributes and floats.
struct Piece {
  std::string kind, name, sharding;
  std::vector<int64_t> shape;
  int64_t padded_rows = 0, tp_rank = 0, tp_size = 1;
  const void* data = nullptr;  // `count` floats; in a packed message (unpack) not aligned: memcpy them
  size_t count = 0;
};

// ---- reading ------------------------------------------------------------------------

// Reads and checks dir/manifest.json and every file it names (present, size, CRC-32).
// UsageError naming the file and what is wrong.
Manifest read_manifest(const std::string& step_dir, bool verify_files = true);
// A manifest's text (`where` names it in errors), for the node files in `step_dir`.
Manifest parse_manifest(const std::string& text, const std::string& step_dir, const std::string& where);
// "step_00001000": a step's directory (and S3 folder) name.
std::string step_name(int step);
// The step of a step folder's name ("step_00001000" -> 1000); -1 if it is not one.
int step_of_name(const std::string& name);
// UsageError unless `path` has the manifest's size and CRC-32 for file `f`.
void verify_node_file(const std::string& path, const ManifestFile& f);
// The newest complete checkpoint under `dir` (following `latest`, falling back to the
// newest earlier complete step if `latest` is damaged, saying so on stderr); nullopt if
// there is none.
std::optional<Manifest> find_latest_checkpoint(const std::string& dir, bool quiet = false);
// The step folder `latest` under `dir` names ("step_00001000"); "" where there is none.
std::string latest_name(const std::string& dir);
// Complete step directories under `dir`, oldest first.
std::vector<std::string> complete_checkpoints(const std::string& dir);
// The full canonical tensors of `kind` (params, or one of m.optimizer_state) of a checkpoint.
std::vector<std::pair<std::string, std::vector<float>>> read_canonical(const Manifest& m, const std::string& kind);

// Where every shard of every tensor of a checkpoint is; the node files stay open.
struct ShardIndex {
  struct Location {
    const Hdf5Reader* file;
    std::string dataset;
    int tp_rank, tp_size;
  };
  std::vector<std::unique_ptr<Hdf5Reader>> files;
  std::map<std::pair<std::string, std::string>, std::vector<Location>> shards;  // (kind, name) -> shards

  // needed: the files to open (files_needed, ckpt/checkpoint_pieces.h); empty: all.
  explicit ShardIndex(const Manifest& m, const std::vector<bool>& needed = {});
  // The dataset of one shard, if the checkpoint has it.
  const Location* find(const std::string& kind, const std::string& name, int tp_rank, int tp_size) const;
  // The full canonical tensor, assembled from its shards with the saved layout.
  std::vector<float> canonical(const Manifest& m, const ParameterLayout& saved, const std::string& kind,
                               const std::string& name) const;
};

// ---- writing ------------------------------------------------------------------------

// "node_0003.h5": node file `node`'s name.
std::string node_file_name(int node);
// Writes the node file `name` into `step_dir` (under a temporary name, synced, renamed):
// the pieces of every rank of the node, one rank's after another. Its size, CRC-32 and
// the shards it holds, for the manifest. Throws on failure (the temporary file removed).
ManifestFile write_node_file(const std::string& step_dir, const std::string& name, int step,
                             const std::vector<std::vector<Piece>>& pieces_of_ranks);
// The node leader's buffers while writing a node file of `layout`: the CRC's reads, one
// piece's aligned copy.
size_t node_file_writer_bytes(const ParameterLayout& layout);
// manifest.json's text for the save of `step`: the run's config and layout, the
// optimizer and its state buffers' names, the training data's fingerprint, and `files`
// (name, bytes, crc32, shards of every node file, in node order).
std::string manifest_text(const Config& config, const ParallelState& parallel, int step, const std::string& optimizer,
                          const std::vector<std::string>& optimizer_state, const std::string& data_fingerprint,
                          const nlohmann::json& files);
// Makes the step complete once every node file is: its manifest.json, then `latest`.
void commit_checkpoint(const std::string& checkpoint_dir, const std::string& step_dir, int step,
                       const std::string& manifest_text);
// Removes the oldest complete checkpoints under `dir` beyond the newest `keep_last` (0:
// none), but not those `in_use` (their node files still going to S3).
void prune_checkpoints(const std::string& dir, int keep_last, const std::function<bool(const std::string&)>& in_use);
// The shards of a node file as manifest.json lists them.
nlohmann::json shards_json(const std::vector<ShardName>& shards);

// ---- the model record, exports, init_from ---------------------------------------------

// The model fields of a manifest or export, and back (older files: defaults).
nlohmann::json model_json(const ModelConfig& m);
ModelConfig model_from_json(const nlohmann::json& j);
// UsageError naming the differing keys unless `saved` has the shapes of `configured`.
void require_same_model(const ModelConfig& saved, const ModelConfig& configured, const std::string& what);
// Writes the parameters of a checkpoint as one HDF5 file of full tensors, params/<name>,
// the layout of the reference files.
void export_checkpoint(const Manifest& m, const std::string& out);
// Initializes parameters from an exported file (params/<name>, full tensors); Hugging
// Face weights: import_hf (ckpt/hf_checkpoint.h).
void init_parameters_from(const ShardedParameters& parameters, const std::string& path);
// A trident checkpoint at `path`: a step folder (its manifest), or a checkpoint folder
// (its newest complete step); nullopt for anything else.
std::optional<Manifest> trident_checkpoint_at(const std::string& path);
// The parameters alone of a trident checkpoint (saved under any layout), for
// checkpoint.init_from: a fine-tune starts at step 0 with fresh optimizer state.
void init_parameters_from_checkpoint(const ShardedParameters& parameters, const ModelConfig& configured,
                                     const Manifest& m);

}  // namespace trident
