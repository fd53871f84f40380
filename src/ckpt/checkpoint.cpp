#include "ckpt/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_transport.h"
#include "ckpt/checkpoint_upload.h"
#include "monitor/step_trace.h"
#include "parallel/agreement.h"
#include "runtime/injected_faults.h"
#include "kernels/base/error.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

// The optimizer's state buffers' names.
std::vector<std::string> state_names(const ShardedState& state) {
  std::vector<std::string> names;
  for (const ShardedBuffer& buffer : state.optimizer_state) names.push_back(buffer.name);
  return names;
}
std::vector<std::string> kinds_of(const ShardedState& state) { return checkpoint_kinds(state_names(state)); }

}  // namespace

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
    : config_(config), parallel_(parallel), state_(std::move(state)),
      node_leaders_(std::make_unique<NodeLeaderTransport>(parallel)) {
  // Touch every host buffer of a save now, once: fresh pages are slow here, and the
  // first checkpoint should stall training no longer than the later ones.
  if (!config.checkpoint.dir.empty()) collect_at_node_leader(0);
  if (!config.checkpoint.upload.empty()) uploader_ = std::make_unique<CheckpointUploader>(config, parallel);
}

size_t Checkpointer::staging_bytes(const ParameterLayout& layout, const std::vector<std::string>& optimizer_state) {
  return ((1 + optimizer_state.size()) * layout.total_floats() + layout.buffer_floats()) * sizeof(float);
}

size_t Checkpointer::piece_bytes(const ParameterLayout& layout, const CheckpointWriter& writer,
                                 const std::vector<std::string>& optimizer_state) {
  std::vector<KindSource> sizes_only;
  for (const std::string& kind : checkpoint_kinds(optimizer_state)) sizes_only.push_back({kind});
  std::vector<Piece> pieces = rank_pieces(layout, writer, sizes_only);
  for (Piece& p : rank_pieces(layout.buffers(), writer, {{kBuffers}})) pieces.push_back(std::move(p));
  return packed_size(pieces);
}

size_t Checkpointer::leader_buffer_bytes(const ParameterLayout& layout) { return node_file_writer_bytes(layout); }

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
  // One replica of each tensor writes it; the declared buffers' too.
  const CheckpointWriter writer{parallel_.dims(), parallel_.coords()};
  std::vector<Piece> pieces = rank_pieces(layout, writer, sources);
  if (!layout.buffers().empty()) {
    host_buffers_.resize(layout.buffer_floats());
    state_.buffers.to_host(host_buffers_.data());
    for (Piece& p : rank_pieces(layout.buffers(), writer, {{kBuffers, host_buffers_.data()}})) pieces.push_back(std::move(p));
  }
  // 2. Hand them to the node leader (ckpt/checkpoint_transport.h).
  node_leaders_->hand_over(step, pieces);
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
  if (parallel_.is_root()) fs::create_directories(p->dir);
  parallel_.world().barrier();  // the directory exists before any leader writes
  // 3. The leader writes the node file, in the background with async.
  pending_ = std::move(p);
  if (node_leaders_->keeps()) {
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
  try {
    p.file = node_leaders_->keep(p.step, p.dir);
  } catch (const std::exception& e) {
    p.error = e.what();
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
  const bool leader = node_leaders_->keeps();
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
        manifest_text = trident::manifest_text(config_, parallel_, p.step, state_.optimizer, state_names(state_),
                                               data_fingerprint_, files);
        commit_checkpoint(config_.checkpoint.dir, p.dir, p.step, manifest_text);
        // Only now that the new one is complete: prune the oldest beyond keep_last (but
        // one whose node files are still going to S3).
        prune_checkpoints(config_.checkpoint.dir, config_.checkpoint.keep_last,
                          [this](const std::string& dir) { return uploader_ != nullptr && uploader_->in_use(dir); });
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
  // This rank's pieces, resharded where the checkpoint's layout differs.
  const std::vector<std::vector<float>> full = read_rank_state(m, layout, kinds_of(state_));
  state_.parameters.from_host(full[0].data());
  state_.parameters.changed();
  for (size_t i = 0; i < state_.optimizer_state.size(); i++) state_.optimizer_state[i].from_host(full[1 + i].data());
  state_.set_optimizer_steps(m.step);
  if (!layout.buffers().empty()) {  // the declared buffers; those saved before they were declared keep their init
    std::vector<float> buffers(layout.buffer_floats());
    state_.buffers.to_host(buffers.data());
    const std::vector<std::string> missing = read_rank_buffers(m, layout, buffers.data());
    state_.buffers.from_host(buffers.data());
    if (!missing.empty() && parallel_.is_root())
      std::printf("checkpoint: %s holds no %s (saved before it was declared): %zu buffer%s start%s from %s init\n",
                  m.dir.c_str(), missing.front().c_str(), missing.size(), missing.size() == 1 ? "" : "s",
                  missing.size() == 1 ? "s" : "", missing.size() == 1 ? "its" : "their");
  }
  return m.step;
}

void Checkpointer::upload_if_missing(const Manifest& m, const std::string& manifest_text) {
  if (!uploader_) return;
  upload_to_s3_if_missing(*uploader_, parallel_, node_leaders_->node_index(), m, manifest_text);
}

}  // namespace trident
