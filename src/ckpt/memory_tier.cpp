#include "ckpt/memory_tier.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "health/health_verdict.h"
#include "runtime/crc32.h"
#include "runtime/random.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'D', 'M', 'E', 'M', '2'};  // 2: CRC-32C
constexpr int kPartnerTag = 0x4D54;  // the world's point-to-point tags of the tier
constexpr int kRestoreTag = 0x4D55;
constexpr size_t kNameChars = 64;
constexpr size_t kChunk = size_t{1} << 30;  // an MPI message's count is an int

// A snapshot file's header, then its floats: the parameters, each optimizer state buffer
// (the layout's total floats each), the buffers.
struct Header {
  char magic[8];
  int64_t step;
  uint64_t floats;
  uint32_t crc32;  // CRC-32C of the floats
  uint32_t unused;
};

float* floats_of(std::vector<std::byte>& bytes) { return reinterpret_cast<float*>(bytes.data() + sizeof(Header)); }

// Empty when `bytes` is an intact snapshot of `step`, else why not.
std::string check_snapshot(const std::vector<std::byte>& bytes, int step, size_t expected_bytes) {
  Header h{};
  if (bytes.size() != expected_bytes) return "not a snapshot of this run's state";
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.step != step ||
      sizeof h + h.floats * sizeof(float) != bytes.size())
    return "not a snapshot of this run's state";
  if (crc32c_of(0, bytes.data() + sizeof h, h.floats * sizeof(float)) != h.crc32)
    return "its CRC-32C does not match (damaged in memory)";
  return "";
}

// Writes `bytes` to `path` through `tmp`, which is written over in place where it exists:
// a file system in RAM gives a fresh page far slower than it copies into one it has (0.4
// GB/s against several on the machines of MACHINE.md). Empty, or the error.
std::string write_file(const std::string& path, const std::string& tmp, const std::vector<std::byte>& bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::strerror(errno);
  std::string error;
  for (size_t done = 0; done < bytes.size() && error.empty();) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) error = n < 0 ? std::strerror(errno) : "no room";
    else done += static_cast<size_t>(n);
  }
  if (error.empty() && ::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0) error = std::strerror(errno);
  if (::close(fd) != 0 && error.empty()) error = std::strerror(errno);
  std::error_code ec;
  if (error.empty()) fs::rename(tmp, path, ec);
  if (ec) error = ec.message();
  if (!error.empty()) fs::remove(tmp, ec);  // a full file system gets its room back
  return error;
}

bool read_file(const std::string& path, std::vector<std::byte>& bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return false;
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<size_t>(size) != bytes.size()) return false;
  in.seekg(0);
  return static_cast<bool>(in.read(reinterpret_cast<char*>(bytes.data()), size));
}

// Large messages in pieces of at most 1 GiB (in order: one tag, one pair of ranks).
void send_bytes(Communicator& c, const std::vector<std::byte>& bytes, int to, int tag, std::vector<RequestPtr>& out) {
  for (size_t at = 0; at < bytes.size(); at += kChunk)
    out.push_back(c.send_async(std::span<const std::byte>(bytes.data() + at, std::min(kChunk, bytes.size() - at)), to, tag));
}
void recv_bytes(Communicator& c, std::vector<std::byte>& bytes, int from, int tag, std::vector<RequestPtr>& out) {
  for (size_t at = 0; at < bytes.size(); at += kChunk)
    out.push_back(c.recv_async(std::span<std::byte>(bytes.data() + at, std::min(kChunk, bytes.size() - at)), from, tag));
}
void wait_all(std::vector<RequestPtr>& requests) {
  for (RequestPtr& r : requests) r->wait();
  requests.clear();
}

// A node's name as a file name's part.
std::string file_safe(std::string name) {
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
  return name.substr(0, kNameChars - 1);
}

// "2-3", "0,2,5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) j++;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

MemoryTier::MemoryTier(const Config& config, ParallelState& parallel, ShardedState state, const std::string& data)
    : config_(config), parallel_(parallel), state_(std::move(state)), folder_(config.checkpoint.memory_dir),
      every_(config.checkpoint.dir.empty() ? 0 : config.checkpoint.memory_every_steps) {
  if (every_ <= 0) return;  // off (and without a checkpoint.dir there is no folder to name)
  // The key: a snapshot is read back only by the same ranks' same shards.
  const ParallelDims& d = parallel.dims();
  std::string layout = fs::absolute(config.checkpoint.dir).lexically_normal().string();
  for (Axis a : {Axis::dp, Axis::tp, Axis::pp, Axis::cp}) layout += " " + std::to_string(d.size(a));
  layout += " ep " + std::to_string(config.parallel.ep) + " zero " + std::to_string(config.parallel.zero) +
            " shard " + std::to_string(config.parallel.shard_size) + " vpp " + std::to_string(config.parallel.vpp) +
            " data " + data;
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(hash_name(layout)));
  key_ = key;
  node_ = file_safe(health::node_name());

  // Every rank's node name and snapshot size (one all-reduce).
  const int world = parallel.dims().world(), rank = parallel.rank();
  const size_t floats = state_.packed_floats();
  std::vector<double> table(static_cast<size_t>(world) * (kNameChars + 1), 0.0);
  for (size_t i = 0; i < node_.size(); i++) table[rank * kNameChars + i] = static_cast<unsigned char>(node_[i]);
  table[world * kNameChars + rank] = static_cast<double>(sizeof(Header) + floats * sizeof(float));
  parallel.world().all_reduce(std::span<double>(table));
  std::vector<std::string> nodes;  // in the order of their first rank
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < world; r++) {
    std::string name;
    for (size_t i = 0; i < kNameChars && table[r * kNameChars + i] != 0; i++)
      name += static_cast<char>(table[r * kNameChars + i]);
    node_of_.push_back(name);
    bytes_of_.push_back(static_cast<size_t>(table[world * kNameChars + r]));
    if (ranks_of[name].empty()) nodes.push_back(name);
    ranks_of[name].push_back(r);
  }
  // The partner: rank j of the next node (j modulo its ranks), and the ranks sending here.
  const auto partner_of = [&](int r) {
    if (nodes.size() < 2) return -1;
    const std::vector<int>& own = ranks_of[node_of_[r]];
    const size_t at = std::find(nodes.begin(), nodes.end(), node_of_[r]) - nodes.begin();
    const std::vector<int>& next = ranks_of[nodes[(at + 1) % nodes.size()]];
    const size_t j = std::find(own.begin(), own.end(), r) - own.begin();
    return next[j % next.size()];
  };
  partner_ = partner_of(rank);
  for (int r = 0; r < world; r++)
    if (partner_of(r) == rank) partner_of_.push_back(r);

  // Room for three snapshots (two kept, one being written) of the node's ranks and of the
  // ranks whose copies it keeps, or the tier stays off: one warning, the disk tier alone.
  for (int r = 0; r < world; r++)
    if (node_of_[r] == node_ || (partner_of(r) >= 0 && node_of_[partner_of(r)] == node_))
      node_bytes_ += 3.0 * static_cast<double>(bytes_of_[r]);
  struct statvfs fs_stat {};
  double free_bytes = statvfs(folder_.c_str(), &fs_stat) == 0
                          ? static_cast<double>(fs_stat.f_bavail) * static_cast<double>(fs_stat.f_frsize)
                          : 0.0;
  // A restart's snapshots already there (its own, a run before's) are room too: written over.
  std::error_code ec;
  for (const Held& h : held_here()) {
    const uintmax_t size = fs::file_size(file(node_, h.rank, h.step), ec);
    if (!ec) free_bytes += static_cast<double>(size);
  }
  disabled_ = parallel.world().all_reduce(free_bytes >= node_bytes_ ? 0.0 : 1.0, ReduceOp::max) > 0;
  if (!disabled_) {  // the host buffers, touched once now (a fresh page costs more than the copy into it)
    outgoing_.assign(bytes_of_[rank], std::byte{0});
    for (int r : partner_of_) incoming_.emplace_back(bytes_of_[r], std::byte{0});
  }
  if (!parallel.is_root()) return;
  if (disabled_)
    std::fprintf(stderr, "warning: memory tier: %s has %.1f MiB free, a node needs %.1f MiB (three snapshots of its "
                 "ranks' state and of its partner's): the run goes on with the disk tier alone\n", folder_.c_str(),
                 free_bytes / (1 << 20), node_bytes_ / (1 << 20));
  else
    std::printf("memory tier: every %d steps, %.1f MiB a rank into %s (%.1f GiB free on rank 0's node); %s\n", every_,
                static_cast<double>(bytes_of_[0]) / (1 << 20), folder_.c_str(), free_bytes / (1 << 30),
                nodes.size() < 2 ? "one node: no partner copies"
                                 : ("a copy of each node's on the next (" + std::to_string(nodes.size()) + " nodes)").c_str());
}

MemoryTier::~MemoryTier() {
  // A copy still in flight is finished; when an exception ends the run it is given up: its
  // requests are left unfinished (and their buffers kept) rather than waited on, as the
  // partner may be the rank that failed.
  if (transfers_.empty()) return;
  if (std::uncaught_exceptions() == 0) {
    try {
      finish_partner_copy();
    } catch (const std::exception& e) {  // the run is over: its end stays as it was
      std::fprintf(stderr, "warning: memory tier: the partner copy of step %d was not finished: %s\n", sending_step_,
                   e.what());
    }
    return;
  }
  for (RequestPtr& r : transfers_) static_cast<void>(r.release());
  static_cast<void>(new std::vector<std::byte>(std::move(outgoing_)));
  static_cast<void>(new std::vector<std::vector<std::byte>>(std::move(incoming_)));
}

std::string MemoryTier::file(const std::string& node, int rank, int step) const {
  return (fs::path(folder_) /
          ("trident-" + key_ + "-" + node + "-r" + std::to_string(rank) + "-s" + std::to_string(step)))
      .string();
}

std::vector<MemoryTier::Held> MemoryTier::held_here() const {
  std::vector<Held> held;
  const std::string prefix = "trident-" + key_ + "-" + node_ + "-r";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // <rank>-s<step>
    const size_t s = rest.find("-s");
    if (s == 0 || s == std::string::npos || rest.find_first_not_of("0123456789") != s ||
        rest.find_first_not_of("0123456789", s + 2) != std::string::npos || s + 2 == rest.size())
      continue;
    held.push_back({std::stoi(rest.substr(0, s)), std::stoi(rest.substr(s + 2))});
  }
  return held;
}

std::string MemoryTier::tmp_file(int rank) const {
  return (fs::path(folder_) / ("trident-" + key_ + "-" + node_ + "-r" + std::to_string(rank) + ".tmp")).string();
}

std::vector<int> MemoryTier::steps_held(int rank) const {
  std::vector<int> steps;
  for (const Held& h : held_here())
    if (h.rank == rank) steps.push_back(h.step);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string MemoryTier::recycled(int rank) {
  // This node's file being written for `rank`: a write cut short before, or the oldest of
  // the two kept, whose pages the new snapshot reuses (one stays complete meanwhile).
  const std::string tmp = tmp_file(rank);
  if (fs::exists(tmp)) return tmp;
  const std::vector<int> steps = steps_held(rank);
  if (steps.size() >= 2) {
    std::error_code ec;
    fs::rename(file(node_, rank, steps.front()), tmp, ec);
  }
  return tmp;
}

void MemoryTier::keep_newest_two(int rank) {
  const std::vector<int> steps = steps_held(rank);
  std::error_code ec;
  for (size_t i = 0; i + 2 < steps.size(); i++) fs::remove(file(node_, rank, steps[i]), ec);
}

void MemoryTier::snapshot(int step, std::vector<std::byte>& bytes) {
  float* body = floats_of(bytes);
  state_.pack(body);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.step = step;
  h.floats = (bytes.size() - sizeof h) / sizeof(float);
  h.crc32 = crc32c_of(0, body, h.floats * sizeof(float));
  std::memcpy(bytes.data(), &h, sizeof h);
}

double MemoryTier::save(int step) {
  const Timer blocked;
  const int completed = step + 1;
  finish_partner_copy();  // the one before (already done: after_step finished it)
  snapshot(completed, outgoing_);
  const std::string path = file(node_, parallel_.rank(), completed);
  const std::string error = write_file(path, recycled(parallel_.rank()), outgoing_);
  // Complete on this node when every rank has its own; otherwise the tier is off from here,
  // said once, by the first rank that failed.
  const double failed = parallel_.world().all_reduce(error.empty() ? 0.0 : 1.0, ReduceOp::sum);
  if (failed > 0) {
    const double first = -parallel_.world().all_reduce(error.empty() ? -1e9 : -parallel_.rank(), ReduceOp::max);
    disabled_ = true;
    remove_all();  // the older snapshots too: the room is the node's
    if (first == parallel_.rank())
      std::fprintf(stderr, "warning: memory tier: rank %d%s could not write the snapshot of step %d to %s (%s): the "
                   "run goes on with the disk tier alone\n", parallel_.rank(),
                   failed > 1 ? (" and " + std::to_string(static_cast<int>(failed) - 1) + " more").c_str() : "",
                   completed, folder_.c_str(), error.c_str());
    return blocked.seconds();
  }
  keep_newest_two(parallel_.rank());
  // The partner copy: posted now, carried by the next step's collectives.
  if (partner_ >= 0 || !partner_of_.empty()) {
    sending_step_ = completed;
    for (size_t i = 0; i < partner_of_.size(); i++)
      recv_bytes(parallel_.world(), incoming_[i], partner_of_[i], kPartnerTag, transfers_);
    if (partner_ >= 0) send_bytes(parallel_.world(), outgoing_, partner_, kPartnerTag, transfers_);
  }
  const double seconds = blocked.seconds();
  if (parallel_.is_root())
    std::printf("memory tier: step %d in node memory (%.1f MiB a rank, %.3f s)%s\n", completed,
                static_cast<double>(bytes_of_[0]) / (1 << 20), seconds,
                partner_ >= 0 ? ", its copy on the way to the partner node" : "");
  return seconds;
}

double MemoryTier::after_step(int step) {
  if (sending_step_ < 0 || step + 1 <= sending_step_) return 0;
  const Timer blocked;
  finish_partner_copy();
  return blocked.seconds();
}

void MemoryTier::finish_partner_copy() {
  if (sending_step_ < 0) return;
  wait_all(transfers_);
  for (size_t i = 0; i < partner_of_.size(); i++) {
    const std::string error =
        write_file(file(node_, partner_of_[i], sending_step_), recycled(partner_of_[i]), incoming_[i]);
    if (!error.empty())  // the copy is missing: a restart needing it falls back to the disk
      std::fprintf(stderr, "warning: memory tier: rank %d could not keep rank %d's copy of step %d (%s)\n",
                   parallel_.rank(), partner_of_[i], sending_step_, error.c_str());
    else
      keep_newest_two(partner_of_[i]);
  }
  sending_step_ = -1;
}

MemoryRestore MemoryTier::restore(int newer_than) {
  MemoryRestore result;
  if (!enabled()) return result;
  const int world = parallel_.dims().world(), rank = parallel_.rank();
  // This node's catalogue, told by its first rank.
  const bool teller = std::find(node_of_.begin(), node_of_.end(), node_) - node_of_.begin() == rank;
  const std::vector<Held> held = teller ? held_here() : std::vector<Held>{};
  const auto newest_below = [&](double bound) {
    double best = -1;
    for (const Held& h : held)
      if (h.step < bound && h.step > newer_than) best = std::max(best, static_cast<double>(h.step));
    return parallel_.world().all_reduce(best, ReduceOp::max);
  };
  // From the newest step any node holds, down: the first whose every rank's piece is
  // somewhere (its own node first).
  std::vector<double> where(2 * static_cast<size_t>(world));
  int step = -1;
  for (double candidate = newest_below(1e18); candidate > newer_than; candidate = newest_below(candidate)) {
    const int s = static_cast<int>(candidate);
    std::fill(where.begin(), where.end(), 0.0);
    for (const Held& h : held)
      if (h.step == s && h.rank < world) where[h.rank] = rank + 1;  // a node that can send it
    if (fs::exists(file(node_, rank, s))) where[world + rank] = 1;  // on this rank's own node
    parallel_.world().all_reduce(std::span<double>(where), ReduceOp::max);
    bool complete = true;
    for (int r = 0; r < world; r++) complete = complete && (where[world + r] > 0 || where[r] > 0);
    if (complete) {
      step = s;
      break;
    }
  }
  if (step < 0) return result;

  // The pieces: read here, or sent by the node that holds them.
  const Timer loading;
  std::vector<std::byte> bytes(bytes_of_[rank]);
  std::vector<RequestPtr> receiving;
  const bool own = where[world + rank] > 0;
  bool read = true;
  if (own) read = read_file(file(node_, rank, step), bytes);
  else recv_bytes(parallel_.world(), bytes, static_cast<int>(where[rank]) - 1, kRestoreTag, receiving);
  // The pieces this rank serves, one at a time through one buffer (a node may hold a lost
  // node's every rank's).
  std::vector<std::byte> serving;
  for (int r = 0; r < world; r++) {
    if (where[world + r] > 0 || static_cast<int>(where[r]) - 1 != rank) continue;
    serving.resize(bytes_of_[r]);
    if (!read_file(file(node_, r, step), serving)) serving.assign(bytes_of_[r], std::byte{0});
    std::vector<RequestPtr> sending;
    send_bytes(parallel_.world(), serving, r, kRestoreTag, sending);  // a bad copy fails its CRC there
    wait_all(sending);
  }
  serving = {};
  wait_all(receiving);
  const std::string error = read ? check_snapshot(bytes, step, bytes_of_[rank]) : "it could not be read";
  const double seconds = loading.seconds();
  // Every rank's intact, or none is used.
  if (parallel_.world().all_reduce(error.empty() ? 0.0 : 1.0, ReduceOp::sum) > 0) {
    if (!error.empty())
      std::fprintf(stderr, "warning: memory tier: rank %d's snapshot of step %d is not used: %s\n", rank, step,
                   error.c_str());
    return result;
  }
  state_.unpack(floats_of(bytes), step);
  result.step = step;

  // The report: each rank's seconds, grouped by where its piece came from.
  std::vector<double> took(world, 0.0);
  took[rank] = seconds;
  parallel_.world().all_reduce(std::span<double>(took), ReduceOp::max);
  if (parallel_.is_root()) {
    std::map<std::string, std::vector<int>> groups;
    for (int r = 0; r < world; r++)
      groups[where[world + r] > 0 ? "" : node_of_[static_cast<int>(where[r]) - 1]].push_back(r);
    for (const auto& [from, ranks] : groups) {
      double most = 0;
      for (int r : ranks) most = std::max(most, took[r]);
      char line[160];
      std::snprintf(line, sizeof line, "%.3f s", most);
      result.report += (result.report.empty() ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") +
                       rank_list(ranks) +
                       (from.empty() ? " from their own node's memory" : " from node " + from + "'s copy (partner)") +
                       " in " + line;
    }
  }
  return result;
}

void MemoryTier::remove_all() {
  if (every_ <= 0) return;
  finish_partner_copy();
  std::error_code ec;
  std::vector<int> mine = partner_of_;
  mine.push_back(parallel_.rank());
  for (const Held& h : held_here())
    if (std::find(mine.begin(), mine.end(), h.rank) != mine.end()) fs::remove(file(node_, h.rank, h.step), ec);
  for (int r : mine) fs::remove(tmp_file(r), ec);
}

}  // namespace trident
