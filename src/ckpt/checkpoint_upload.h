// The second tier of checkpoints (checkpoint.upload): after a checkpoint is complete on
// disk, every node leader uploads its own node file to S3 in the background (one upload
// per node, not one per rank; multipart, parts in parallel); once every node file is
// confirmed, rank 0 uploads manifest.json and then `latest`, and prunes S3 to keep_last.
// Training does not wait: each step, poll() moves the uploads on. A checkpoint completed
// while the previous one is still uploading waits for it (a newer one replaces it in the
// queue); the one uploading stays on disk until its node files are in S3.
// A failed upload (the store down past checkpoint.s3_retry_s) is a warning: S3's latest
// still names the last complete checkpoint, and the next checkpoint uploads again.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/checkpoint_format.h"
#include "ckpt/remote_checkpoints.h"
#include "config/config.h"
#include "parallel/parallel_state.h"
#include "runtime/timer.h"

namespace trident {

class CheckpointUploader {
 public:
  // Collective: credentials found and the bucket usable, else an agreed UsageError on
  // every rank (exit 2) before any training.
  CheckpointUploader(const Config& config, ParallelState& parallel);
  ~CheckpointUploader();  // abandons what is still uploading

  // Collective, once a checkpoint is complete on disk: `file` is this node leader's node
  // file (empty name elsewhere), `manifest` the manifest's text (rank 0).
  void submit(int step, const std::string& dir, const ManifestFile& file, const std::string& manifest);
  // Collective, each step: moves the uploads on, says on rank 0 when one is complete.
  void poll();
  // Collective: waits up to checkpoint.upload_timeout_s for everything submitted. Empty
  // if the newest checkpoint submitted is committed in S3; else why not, on every rank
  // (timed out: then abandoned; or its upload failed).
  std::string finish();
  // Whether the node files of step directory `dir` are still being uploaded.
  bool in_use(const std::string& dir) const;
  RemoteCheckpoints& remote() { return *remote_; }  // rank 0 and the node leaders
  RemoteCheckpoints* remote_if_here() { return remote_.get(); }
  // Rank 0: the step folder S3's latest names (read at the start, then what this run committed).
  const std::optional<std::string>& s3_latest() const { return s3_latest_; }
  // Totals over this run (rank 0's counts for its own requests and the commits).
  int uploads_completed() const { return completed_; }
  // Rank 0, for the monitors: the step S3's latest names (-1: none), how many steps it is
  // behind the newest checkpoint given to upload (0 before any), and the last completed
  // upload's bytes, seconds and retried requests.
  struct Status {
    int s3_step = -1, lag_steps = 0;
    double bytes = 0, seconds = 0, retries = 0;
  };
  Status status() const;

 private:
  struct Upload;
  struct Commit;
  void start(Upload& u);
  void start_commit_if_ready();
  void finish_commit_if_done();

  const Config& config_;
  ParallelState& parallel_;
  std::unique_ptr<RemoteCheckpoints> remote_;  // rank 0 and the node leaders
  std::unique_ptr<Upload> active_, waiting_;  // the same on every rank
  std::unique_ptr<Commit> commit_;            // rank 0: manifest and latest of an uploaded step
  std::vector<std::unique_ptr<Commit>> ready_;  // rank 0: node files confirmed, commit not begun
  int completed_ = 0;
  int newest_submitted_ = -1;  // the same on every rank
  std::optional<std::string> s3_latest_;  // rank 0: what S3's latest names, as of our last commit
  Status last_;                           // rank 0: the last completed upload's figures
};

}  // namespace trident
