// How a checkpoint's pieces travel from the ranks to where they are kept, and back.
//
// Every way moves the same thing: a rank's pieces (ckpt/checkpoint_pieces.h) packed as one
// message (pack, unpack). The ways:
//  - Node leaders (NodeLeaderTransport, a PieceTransport): each node's ranks hand their
//    packed pieces to the node leader over the node communicator, and the leader writes
//    them as the node's file into the step folder (ckpt/checkpoint_format.h), so shared
//    storage sees one writer per node.
//  - S3 (checkpoint.upload), a second tier after the disk: once a checkpoint is complete
//    there, each node leader uploads its node file (CheckpointUploader,
//    ckpt/checkpoint_upload.h); a resume finding nothing as new on disk downloads the
//    files its node reads (stage_from_s3, ckpt/checkpoint_download.h); upload_if_missing
//    catches up on an upload that a run did not finish.
//  - A memory tier (node memory with a peer node's copy) is a PieceTransport beside the
//    node leaders': its hand_over copies the packed pieces into node memory, its keep sends
//    them to the partner node.
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint_format.h"
#include "parallel/parallel_state.h"

namespace trident {

class CheckpointUploader;

// A rank's pieces as one message: the header's length, the header (JSON: every piece's
// attributes and float count), then the floats of every piece in order.
void pack(const std::vector<Piece>& pieces, std::vector<char>& blob);  // keeps blob's capacity
size_t packed_size(const std::vector<Piece>& pieces);                   // data may be null
// The pieces of a message, their data pointing into `blob`.
std::vector<Piece> unpack(const std::vector<char>& blob);

// One way a save's pieces go from the ranks to where they are kept. For the save of step
// s, the Checkpointer calls hand_over on every rank (collective, while training waits: a
// copy and messages only), then keep where keeps() (on a background thread with
// checkpoint.async), and rank 0 lists every kept file in the manifest.
class PieceTransport {
 public:
  virtual ~PieceTransport() = default;
  // Collective: this rank's pieces (views into its host copy of its state, valid for the
  // call) go into the transport's buffers, which keep their memory between saves.
  // step: the save's (0: the buffers' first touch, nothing is kept).
  virtual void hand_over(int step, const std::vector<Piece>& pieces) = 0;
  // Whether this rank keeps what was handed over (calls keep).
  virtual bool keeps() const = 0;
  // Keeps what was handed over for the save of `step` in `step_dir`: the file written,
  // for the manifest. Throws on failure.
  virtual ManifestFile keep(int step, const std::string& step_dir) = 0;
};

// The node leaders' disk writes: hand_over gathers the node's pieces at its leader (in
// messages below 1 GiB, every wait bounded by the node communicator), keep writes them as
// node file node_index() (the leader's place among the leaders).
class NodeLeaderTransport : public PieceTransport {
 public:
  explicit NodeLeaderTransport(ParallelState& parallel);  // collective
  void hand_over(int step, const std::vector<Piece>& pieces) override;
  bool keeps() const override;
  ManifestFile keep(int step, const std::string& step_dir) override;
  int node_index() const { return node_index_; }

 private:
  ParallelState& parallel_;
  std::vector<std::vector<char>> node_blobs_;  // the node's packed pieces (the leader's); else this rank's
  int node_index_ = 0;
};

// Collective, after resuming from disk checkpoint `m` (its manifest's text): uploads it if
// S3's latest is older (a run whose last upload did not finish), when this run has the
// saving run's nodes; node leader i uploads node file i (node_index), as the saving run's
// leader i wrote it.
void upload_to_s3_if_missing(CheckpointUploader& uploader, ParallelState& parallel, int node_index,
                             const Manifest& m, const std::string& manifest_text);

}  // namespace trident
