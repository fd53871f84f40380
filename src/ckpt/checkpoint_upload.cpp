#include "ckpt/checkpoint_upload.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "parallel/agreement.h"
#include "kernels/base/error.h"
#include "storage/background_priority.h"

namespace fs = std::filesystem;

namespace trident {

struct CheckpointUploader::Upload {
  int step = 0;
  std::string dir, manifest;
  ManifestFile file;  // this node leader's; empty name elsewhere
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;
  S3Transfer transfer;
  uint64_t retries = 0, slowdowns = 0, requests = 0;
  Timer since;
};

struct CheckpointUploader::Commit {
  int step = 0;
  std::string manifest;
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;
  std::vector<std::string> pruned;
  // What the node files took: bytes, files, the slowest leader's seconds, retries.
  double bytes = 0, seconds = 0;
  int files = 0;
  uint64_t retries = 0, slowdowns = 0, requests = 0;
};

namespace {


}  // namespace

CheckpointUploader::CheckpointUploader(const Config& config, ParallelState& parallel)
    : config_(config), parallel_(parallel) {
  const CheckpointConfig& c = config.checkpoint;
  run_collectively([&] {
    if (parallel.is_root() || parallel.node().rank() == 0) remote_ = std::make_unique<RemoteCheckpoints>(c.upload, c);
    if (parallel.is_root()) {
      remote_->client().check_bucket(remote_->uri().key(""));
      s3_latest_ = remote_->latest();
    }
  });
  if (parallel.is_root()) std::printf("checkpoint: each checkpoint goes on to %s\n", remote_->describe().c_str());
}

CheckpointUploader::~CheckpointUploader() {
  if (remote_) remote_->client().cancel();
  for (Upload* u : {active_.get(), waiting_.get()})
    if (u != nullptr && u->thread.joinable()) u->thread.join();
  if (commit_ && commit_->thread.joinable()) commit_->thread.join();
}

bool CheckpointUploader::in_use(const std::string& dir) const {
  return (active_ && active_->dir == dir) || (waiting_ && waiting_->dir == dir);
}

void CheckpointUploader::submit(int step, const std::string& dir, const ManifestFile& file, const std::string& manifest) {
  newest_submitted_ = step;
  auto u = std::make_unique<Upload>();
  u->step = step;
  u->dir = dir;
  u->file = file;
  u->manifest = manifest;
  if (!active_) {
    active_ = std::move(u);
    start(*active_);
    return;
  }
  if (parallel_.is_root()) {
    if (waiting_)
      std::printf("checkpoint: step %d is not uploaded: step %d is newer\n", waiting_->step, step);
    std::printf("checkpoint: step %d's upload waits for step %d's (uploading for %.1f s)\n", step, active_->step,
                active_->since.seconds());
  }
  waiting_ = std::move(u);
}

void CheckpointUploader::start(Upload& u) {
  u.since = Timer();
  if (u.file.name.empty()) {
    u.done = true;
    return;
  }
  u.thread = std::thread([this, &u] {
    run_in_background();
    S3Client& client = remote_->client();
    try {
      const std::string path = (fs::path(u.dir) / u.file.name).string();
      u.transfer = client.upload_file(path, remote_->key(step_name(u.step), u.file.name));
      if (u.transfer.crc32 != u.file.crc32)
        u.error = path + " changed on disk after it was written (its CRC-32 is not the manifest's)";
    } catch (const std::exception& e) {
      u.error = e.what();
    }
    // This upload's own counts (on rank 0 the commit thread shares the client).
    u.retries = u.transfer.retries;
    u.slowdowns = u.transfer.slowdowns;
    u.requests = u.transfer.requests;
    u.done = true;
  });
}

void CheckpointUploader::poll() {
  if (parallel_.is_root()) {
    finish_commit_if_done();
    start_commit_if_ready();
  }
  if (!active_) return;
  Communicator& world = parallel_.world();
  if (world.all_reduce(active_->done ? 1.0 : 0.0, ReduceOp::sum) < world.size()) return;
  Upload& u = *active_;
  if (u.thread.joinable()) u.thread.join();
  // Every node leader's outcome to rank 0.
  const nlohmann::json report =
      u.file.name.empty() ? nlohmann::json(nullptr)
                          : nlohmann::json{{"error", u.error}, {"bytes", u.transfer.bytes}, {"seconds", u.transfer.seconds},
                                           {"retries", u.retries}, {"slowdowns", u.slowdowns}, {"requests", u.requests}};
  const std::vector<std::string> reports = world.gather_strings(report.dump());
  if (parallel_.is_root()) {
    auto c = std::make_unique<Commit>();
    c->step = u.step;
    c->manifest = u.manifest;
    std::string errors;
    for (const std::string& r : reports) {
      const nlohmann::json j = nlohmann::json::parse(r);
      if (j.is_null()) continue;
      if (!j["error"].get<std::string>().empty()) errors += j["error"].get<std::string>() + "; ";
      c->bytes += j["bytes"].get<double>();
      c->seconds = std::max(c->seconds, j["seconds"].get<double>());
      c->files++;
      c->retries += j["retries"].get<uint64_t>();
      c->slowdowns += j["slowdowns"].get<uint64_t>();
      c->requests += j["requests"].get<uint64_t>();
    }
    if (errors.empty()) {
      ready_.push_back(std::move(c));
      start_commit_if_ready();
    } else {
      // What S3 still names, as this run knows it: asking the store now would wait out its
      // retries, in the training loop, while the store is the thing that failed.
      std::printf("checkpoint: warning: step %d was not uploaded to %s: %sS3's latest is %s; the next checkpoint "
                  "uploads again (step %d stays on disk)\n",
                  u.step, remote_->uri().str().c_str(), errors.c_str(),
                  s3_latest_ ? s3_latest_->c_str() : "still none", u.step);
    }
  }
  active_ = std::move(waiting_);
  if (active_) start(*active_);
}

void CheckpointUploader::start_commit_if_ready() {
  if (commit_ || ready_.empty()) return;
  commit_ = std::move(ready_.front());
  ready_.erase(ready_.begin());
  Commit& c = *commit_;
  c.thread = std::thread([this, &c] {
    run_in_background();
    try {
      remote_->commit(step_name(c.step), c.manifest);
      c.requests += 2;
      if (config_.checkpoint.keep_last > 0) c.pruned = remote_->prune(config_.checkpoint.keep_last, step_name(c.step));
    } catch (const std::exception& e) {
      c.error = e.what();
    }
    c.done = true;
  });
}

void CheckpointUploader::finish_commit_if_done() {
  if (!commit_ || !commit_->done) return;
  Commit& c = *commit_;
  c.thread.join();
  if (!c.error.empty()) {
    std::printf("checkpoint: warning: step %d's node files are in S3, but its manifest or latest could not be "
                "written (%s): S3's latest still names the checkpoint before it\n",
                c.step, c.error.c_str());
  } else {
    completed_++;
    s3_latest_ = step_name(c.step);
    last_.bytes = c.bytes;
    last_.seconds = c.seconds;
    last_.retries = static_cast<double>(c.retries);
    std::string pruned;
    for (const std::string& p : c.pruned) pruned += (pruned.empty() ? "; removed from S3: " : ", ") + p;
    std::printf("checkpoint: step %d uploaded to %s: %d node file%s, %.1f MB in %.2f s (%.1f MB/s), %llu requests, "
                "%llu retried (%llu on 503 Slow Down)%s\n",
                c.step, (remote_->uri().str() + "/" + step_name(c.step)).c_str(), c.files, c.files == 1 ? "" : "s", c.bytes / 1e6,
                c.seconds, c.bytes / 1e6 / std::max(c.seconds, 1e-9), static_cast<unsigned long long>(c.requests),
                static_cast<unsigned long long>(c.retries), static_cast<unsigned long long>(c.slowdowns),
                pruned.c_str());
  }
  std::fflush(stdout);
  commit_.reset();
}

CheckpointUploader::Status CheckpointUploader::status() const {
  Status s = last_;
  s.s3_step = s3_latest_ ? step_of_name(*s3_latest_) : -1;
  s.lag_steps = newest_submitted_ >= 0 ? std::max(0, newest_submitted_ - std::max(s.s3_step, 0)) : 0;
  return s;
}

std::string CheckpointUploader::finish() {
  const double timeout = config_.checkpoint.upload_timeout_s;
  const Timer waiting;
  bool said = false;
  for (;;) {
    poll();
    const bool root = parallel_.is_root();
    double state[2] = {(active_ || waiting_ || (root && (commit_ || !ready_.empty()))) ? 1.0 : 0.0,
                       root && waiting.seconds() > timeout ? 1.0 : 0.0};
    parallel_.world().all_reduce(std::span<double>(state, 2), ReduceOp::max);
    if (state[0] == 0) {
      // Everything settled: did the newest checkpoint get there (its failure was a warning)?
      std::string why;
      if (root && newest_submitted_ >= 0 && s3_latest_ != step_name(newest_submitted_))
        why = "the upload of step " + std::to_string(newest_submitted_) + " failed (the warning above); S3's latest is " +
              s3_latest_.value_or("none");
      return broadcast_string(why);
    }
    if (!said && root) {
      const int step = waiting_ ? waiting_->step : active_ ? active_->step : !ready_.empty() ? ready_.back()->step
                                                                                             : commit_->step;
      std::printf("checkpoint: waiting for step %d's upload to S3 (at most %.0f s, checkpoint.upload_timeout_s)\n", step,
                  timeout);
      std::fflush(stdout);
      said = true;
    }
    if (state[1] > 0) {
      if (remote_) remote_->client().cancel();
      return "it did not finish within checkpoint.upload_timeout_s (" + std::to_string(static_cast<int>(timeout)) +
             " s)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace trident
