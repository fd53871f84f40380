// Hierarchical checkpoints (DESIGN.md):
//   <dir>/step_00001000/node_0000.h5 ... node_NNNN.h5   one file per node, written by its leader
//   <dir>/step_00001000/manifest.json                     step, layout, config, files, checksums
//   <dir>/latest                                          name of the newest complete step dir
// The ranks of a node hand their pieces to the node leader over the node communicator,
// so shared storage sees one writer per node. Every piece is a canonical tensor's shard:
// the dataset /<kind>/<name>/tp<r>of<P> (kind: params, or a state buffer of the optimizer:
// AdamW's exp_avg and exp_avg_sq, Lion's exp_avg) holds tp
// shard r of P, flat, with the tensor's global shape and sharding as attributes, so a
// checkpoint loads under any (dp, tp, pp) and with ZeRO on or off.
//
// Durability: files are written under temporary names, synced, renamed; manifest.json
// is renamed into place only after every node file is complete, and `latest` last. A
// step directory without manifest.json does not count, so a crash at any instant leaves
// the previous checkpoint loadable.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "model/parameters.h"
#include "parallel/parallel_state.h"

namespace trident {

class CheckpointUploader;

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
// Which of a checkpoint's node files a rank of `layout` reads to load it: the ones
// holding its own shards, else every one holding a shard of a tensor it reshards.
std::vector<bool> files_needed(const Manifest& m, const ParameterLayout& layout);
// The newest complete checkpoint under `dir` (following `latest`, falling back to the
// newest earlier complete step if `latest` is damaged, saying so on stderr); nullopt if
// there is none.
std::optional<Manifest> find_latest_checkpoint(const std::string& dir, bool quiet = false);
// Complete step directories under `dir`, oldest first.
std::vector<std::string> complete_checkpoints(const std::string& dir);
// The full canonical tensors of `kind` (params, or one of m.optimizer_state) of a checkpoint.
std::vector<std::pair<std::string, std::vector<float>>> read_canonical(const Manifest& m, const std::string& kind);

// Which of its tensors a rank writes: one copy of each, from the first rank of the set
// holding it replicated (model/placement.h): of its data axes' group, and of the tp ranks
// holding its piece, the one whose copy counts.
struct CheckpointWriter {
  ParallelDims dims;
  RankCoords coords;
  bool writes(const Placement& p) const { return p.counted && dims.group_rank(coords, p.data_axes()) == 0; }
};

class Checkpointer {
 public:
  // state: this rank's named, sharded views of the training state.
  Checkpointer(const Config& config, ParallelState& parallel, ShardedState state);
  ~Checkpointer();

  // Saves the state after `step` optimizer steps (collective). With async, the node
  // files are written by a background thread and finished by poll()/finish().
  void save(int step);
  // Collective, every step while a save is pending: completes it once every node file
  // is written (manifest, latest, pruning). Returns true if one was completed.
  bool poll();
  // Waits for a pending save and completes it (collective).
  void finish();
  // Restores a checkpoint (collective); returns its step. A checkpoint of other
  // training data than set_data()'s is bad input: its data position means nothing here.
  int load(const Manifest& manifest);
  // checkpoint.upload: each complete checkpoint goes on to S3 (ckpt/checkpoint_upload.h).
  CheckpointUploader* uploader() { return uploader_.get(); }
  // Collective, after resuming from disk: uploads that checkpoint if S3's latest is older
  // (a run whose last upload did not finish), when this run has the saving run's nodes.
  void upload_if_missing(const Manifest& m, const std::string& manifest_text);
  const ParameterLayout& layout() const { return *state_.parameters.layout; }
  // What the training reads (TrainingData::fingerprint), recorded with every save.
  void set_data(const std::string& fingerprint) { data_fingerprint_ = fingerprint; }
  double last_stall_s() const { return last_stall_s_; }
  // Host memory of a save (for memory plans: the parameters and the optimizer's state
  // buffers, by name): this rank's copy of its state, and the blob of pieces it hands its
  // node leader (dp rank 0 only writes: `writer`).
  static size_t staging_bytes(const ParameterLayout& layout, const std::vector<std::string>& optimizer_state);
  static size_t piece_bytes(const ParameterLayout& layout, const CheckpointWriter& writer,
                            const std::vector<std::string>& optimizer_state);
  // The node leader's buffers while writing: one piece's aligned copy, the CRC's reads.
  static size_t leader_buffer_bytes(const ParameterLayout& layout);

 private:
  struct Pending;
  // Copies this rank's pieces to host memory and gathers the node's at its leader
  // (through the node communicator: every wait bounded).
  void collect_at_node_leader(int step);  // step: of the save (0: the buffers' first touch)
  void write_node_file(Pending& p);
  void complete(Pending& p);

  const Config& config_;
  ParallelState& parallel_;
  ShardedState state_;
  std::unique_ptr<Pending> pending_;
  std::unique_ptr<CheckpointUploader> uploader_;
  // Host buffers reused by every save: this rank's state (the parameters, then each
  // moment), and (leader) the node's pieces.
  std::vector<std::vector<float>> host_state_;
  std::vector<std::vector<char>> node_blobs_;
  int node_index_ = 0;  // this node's file number: its leader's place among the leaders
  std::string data_fingerprint_;
  double last_stall_s_ = 0;
};

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
// The model fields of a manifest or export, and back (older files: defaults).
nlohmann::json model_json(const ModelConfig& m);
ModelConfig model_from_json(const nlohmann::json& j);
// UsageError naming the differing keys unless `saved` has the shapes of `configured`.
void require_same_model(const ModelConfig& saved, const ModelConfig& configured, const std::string& what);
// Writes the parameters of a checkpoint as one HDF5 file of full tensors, params/<name>,
// the layout of the reference files.
void export_checkpoint(const Manifest& m, const std::string& out);

}  // namespace trident
