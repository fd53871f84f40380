#include "ckpt/memory_tier.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "parallel/node_leaders.h"
#include "runtime/crc32.h"
#include "runtime/random.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'D', 'M', 'E', 'M', '1'};

// A snapshot file's header, then its floats: the parameters, each optimizer state buffer
// (the layout's total floats each), the buffers.
struct Header {
  char magic[8];
  int64_t step;
  uint64_t floats;
  uint32_t crc32;
  uint32_t unused;
};

uint32_t crc_of(const std::vector<float>& v) { return crc32_of(0, v.data(), v.size() * sizeof(float)); }

}  // namespace

MemoryTier::MemoryTier(const Config& config, ParallelState& parallel, ShardedState state, const std::string& data,
                       std::string folder)
    : config_(config), parallel_(parallel), state_(std::move(state)), folder_(std::move(folder)),
      every_(config.checkpoint.dir.empty() ? 0 : config.checkpoint.memory_every_steps) {
  if (every_ <= 0) return;  // off (and without a checkpoint.dir there is no folder to name)
  // The folder and the layout: a snapshot is read back only by the same ranks' same shards.
  const ParallelDims& d = parallel.dims();
  std::string layout = fs::absolute(config.checkpoint.dir).lexically_normal().string();
  for (Axis a : {Axis::dp, Axis::tp, Axis::pp, Axis::cp}) layout += " " + std::to_string(d.size(a));
  layout += " ep " + std::to_string(config.parallel.ep) + " zero " + std::to_string(config.parallel.zero) +
            " shard " + std::to_string(config.parallel.shard_size) + " vpp " + std::to_string(config.parallel.vpp) +
            " data " + data;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(hash_name(layout)));
  key_ = key;
  // Room for three snapshots of every rank of a node (two kept, one being written), or the
  // tier stays off: one warning, the disk tier alone.
  const ParameterLayout& l = *state_.parameters.layout;
  const double bytes = static_cast<double>(sizeof(Header)) +
                       static_cast<double>((1 + state_.optimizer_state.size()) * l.total_floats() + l.buffer_floats()) *
                           sizeof(float);
  const NodeLeaders nodes = node_leaders(parallel);
  const double needed = 3 * bytes * parallel.dims().world() / std::max(1, nodes.count);
  struct statvfs fs_stat {};
  const double free_bytes = statvfs(folder_.c_str(), &fs_stat) == 0
                                ? static_cast<double>(fs_stat.f_bavail) * static_cast<double>(fs_stat.f_frsize)
                                : 0.0;
  disabled_ = parallel.world().all_reduce(free_bytes >= needed ? 0.0 : 1.0, ReduceOp::max) > 0;
  if (!parallel.is_root()) return;
  if (disabled_)
    std::fprintf(stderr, "warning: memory tier: %s has %.1f MiB free, a node needs %.1f MiB (three snapshots of its "
                 "ranks' state): the run goes on with the disk tier alone\n", folder_.c_str(), free_bytes / (1 << 20),
                 needed / (1 << 20));
  else
    std::printf("memory tier: every %d steps, %.1f MiB a rank into %s (%.1f GiB free on rank 0's node)\n", every_,
                bytes / (1 << 20), folder_.c_str(), free_bytes / (1 << 30));
}

std::string MemoryTier::rank_file(int step, int rank) const {
  return (fs::path(folder_) / ("trident-" + key_ + "-r" + std::to_string(rank) + "-s" + std::to_string(step))).string();
}

std::vector<int> MemoryTier::steps_held() const {
  // This rank's snapshot files, by step.
  std::vector<int> steps;
  const std::string prefix = "trident-" + key_ + "-r" + std::to_string(parallel_.rank()) + "-s";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) continue;
    steps.push_back(std::stoi(rest));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

double MemoryTier::save(int step) {
  const Timer blocked;
  const int completed = step + 1;
  const ParameterLayout& layout = *state_.parameters.layout;
  const size_t n = layout.total_floats();
  std::vector<float> body((1 + state_.optimizer_state.size()) * n + layout.buffer_floats());
  state_.parameters.to_host(body.data());
  for (size_t i = 0; i < state_.optimizer_state.size(); i++) state_.optimizer_state[i].to_host(body.data() + (1 + i) * n);
  if (layout.buffer_floats() > 0) state_.buffers.to_host(body.data() + (1 + state_.optimizer_state.size()) * n);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.step = completed;
  h.floats = body.size();
  h.crc32 = crc_of(body);
  const std::string path = rank_file(completed, parallel_.rank()), tmp = path + ".tmp";
  std::string error;
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) error = std::strerror(errno);
    else {
      const bool written = std::fwrite(&h, sizeof h, 1, f) == 1 &&
                           std::fwrite(body.data(), sizeof(float), body.size(), f) == body.size();
      if (!written) error = std::strerror(errno);
      if (std::fclose(f) != 0 && error.empty()) error = std::strerror(errno);
    }
  }
  std::error_code ec;
  if (error.empty()) fs::rename(tmp, path, ec);
  if (ec) error = ec.message();
  if (!error.empty()) fs::remove(tmp, ec);
  // Complete when every rank has its own; otherwise the tier is off from here (one warning).
  const double failed = parallel_.world().all_reduce(error.empty() ? 0.0 : 1.0, ReduceOp::sum);
  if (failed > 0) {
    disabled_ = true;
    fs::remove(path, ec);
    if (!error.empty())
      std::fprintf(stderr, "warning: memory tier: rank %d could not write its snapshot of step %d to %s (%s): the "
                   "run goes on with the disk tier alone\n", parallel_.rank(), completed, folder_.c_str(), error.c_str());
    return blocked.seconds();
  }
  // Two complete snapshots kept: this rank's older files go.
  const std::vector<int> held = steps_held();
  for (size_t i = 0; i + 2 < held.size(); i++) fs::remove(rank_file(held[i], parallel_.rank()), ec);
  const double seconds = blocked.seconds();
  if (parallel_.is_root())
    std::printf("memory tier: step %d in node memory (%.1f MiB a rank, %.3f s)\n", completed,
                static_cast<double>(sizeof h + body.size() * sizeof(float)) / (1 << 20), seconds);
  return seconds;
}

int MemoryTier::newest_complete() {
  if (!enabled()) return -1;
  const std::vector<int> mine = steps_held();
  // The newest step that every rank holds: from the newest any rank has, down.
  double candidate = parallel_.world().all_reduce(mine.empty() ? -1.0 : static_cast<double>(mine.back()), ReduceOp::max);
  while (candidate >= 0) {
    const int step = static_cast<int>(candidate);
    const bool have = std::binary_search(mine.begin(), mine.end(), step);
    if (parallel_.world().all_reduce(have ? 0.0 : 1.0, ReduceOp::max) == 0) return step;  // no rank lacks it
    double below = -1;
    for (int s : mine)
      if (s < step) below = s;
    candidate = parallel_.world().all_reduce(below, ReduceOp::max);
  }
  return -1;
}

bool MemoryTier::load(int step) {
  const ParameterLayout& layout = *state_.parameters.layout;
  const size_t n = layout.total_floats();
  std::vector<float> body((1 + state_.optimizer_state.size()) * n + layout.buffer_floats());
  std::string error;
  {
    std::ifstream in(rank_file(step, parallel_.rank()), std::ios::binary);
    Header h{};
    in.read(reinterpret_cast<char*>(&h), sizeof h);
    if (!in || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.step != step || h.floats != body.size())
      error = "not a snapshot of this run's state";
    else if (!in.read(reinterpret_cast<char*>(body.data()), static_cast<std::streamsize>(body.size() * sizeof(float))))
      error = "cut short";
    else if (crc_of(body) != h.crc32)
      error = "its CRC-32 does not match (damaged in memory)";
  }
  // Every rank's intact, or none is used.
  if (parallel_.world().all_reduce(error.empty() ? 0.0 : 1.0, ReduceOp::sum) > 0) {
    if (!error.empty())
      std::fprintf(stderr, "warning: memory tier: rank %d's snapshot of step %d is not used: %s\n", parallel_.rank(),
                   step, error.c_str());
    return false;
  }
  state_.parameters.from_host(body.data());
  if (state_.parameters.changed) state_.parameters.changed();
  for (size_t i = 0; i < state_.optimizer_state.size(); i++) state_.optimizer_state[i].from_host(body.data() + (1 + i) * n);
  if (layout.buffer_floats() > 0) state_.buffers.from_host(body.data() + (1 + state_.optimizer_state.size()) * n);
  state_.set_optimizer_steps(step);
  return true;
}

void MemoryTier::remove_all() {
  if (every_ <= 0) return;
  std::error_code ec;
  for (int s : steps_held()) fs::remove(rank_file(s, parallel_.rank()), ec);
}

}  // namespace trident
