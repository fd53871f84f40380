// Checkpoints, in three parts this coordinator puts together:
//   ckpt/checkpoint_pieces.h     which pieces of its state a rank writes, and reads back
//   ckpt/checkpoint_transport.h  how they travel: to the node leaders, who write the node
//                                files; on to S3 and back (and a memory tier next)
//   ckpt/checkpoint_format.h     the files: HDF5 node files, manifest.json, latest, pruning
// A save copies this rank's state to host memory, hands its pieces to the node leader,
// which writes the node file (in the background with checkpoint.async); once every node
// file is written, rank 0 writes the manifest and `latest`, prunes, and S3 follows.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint_format.h"
#include "ckpt/checkpoint_pieces.h"
#include "ckpt/sharded_state.h"
#include "config/config.h"
#include "model/parameters.h"
#include "parallel/parallel_state.h"

namespace trident {

class CheckpointUploader;
class NodeLeaderTransport;

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
  // Copies this rank's state to host memory and hands its pieces to the node leader.
  // step: of the save (0: the buffers' first touch).
  void collect_at_node_leader(int step);
  void write_node_file(Pending& p);
  void complete(Pending& p);

  const Config& config_;
  ParallelState& parallel_;
  ShardedState state_;
  std::unique_ptr<Pending> pending_;
  std::unique_ptr<NodeLeaderTransport> node_leaders_;  // the pieces' way to the node files
  std::unique_ptr<CheckpointUploader> uploader_;
  // Reused by every save: this rank's state in host memory (the parameters, then each
  // buffer of the optimizer's state).
  std::vector<std::vector<float>> host_state_;
  std::vector<float> host_buffers_;  // the declared buffers' (ShardedState::buffers)
  std::string data_fingerprint_;
  double last_stall_s_ = 0;
};

}  // namespace trident
