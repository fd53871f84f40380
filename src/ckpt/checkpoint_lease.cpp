#include "ckpt/checkpoint_lease.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "runtime/wall_clock.h"

namespace trident {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLeaseName = "LEASE";

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Process `pid` as /proc/PID/stat has it: its state (R, S, ..., Z: a zombie) and its
// start time in clock ticks since boot (field 22); state 0 when there is no such process.
struct ProcessStat {
  char state = 0;
  unsigned long long start_ticks = 0;
};

ProcessStat process_stat(long pid) {
  const std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  const size_t end_of_name = stat.rfind(')');  // the command name may hold spaces
  ProcessStat p;
  if (end_of_name == std::string::npos || end_of_name + 2 >= stat.size()) return p;
  std::istringstream fields(stat.substr(end_of_name + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; i++) {
    if (i == 3) p.state = field[0];
    if (i == 22) p.start_ticks = std::strtoull(field.c_str(), nullptr, 10);
  }
  return p;
}

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, s < 10 ? "%.1f s" : "%.0f s", s);
  return text;
}

// The file's text; nullopt if it does not exist. UsageError if it cannot be read.
std::optional<std::string> read_text(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw UsageError("cannot read the lease " + path + ": " + std::strerror(errno));
  }
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
  const int error = errno;
  close(fd);
  if (n < 0) throw UsageError("cannot read the lease " + path + ": " + std::strerror(error));
  return text;
}

double mtime_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

void sync_folder(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);  // best effort: a lease lost in a crash belongs to a run that is gone
  close(fd);
}

// What a lease file holds, parsed when it can be (a file that is not a lease counts as
// a holder of its own: judged by the file's age).
LeaseHolder holder_of(const std::string& text) {
  try {
    return parse_lease(text);
  } catch (const UsageError&) {
    LeaseHolder unknown;
    unknown.host = "(unreadable lease)";
    return unknown;
  }
}

}  // namespace

std::string LeaseHolder::describe(double now) const {
  std::string s = "host " + host + ", pid " + std::to_string(pid);
  if (!job.empty()) {
    s += ", Slurm job " + job;
    if (!array_job.empty()) s += " (array " + array_job + "_" + array_task + ")";
  }
  if (renewed > 0) s += ", lease renewed " + format_seconds(std::max(0.0, now - renewed)) + " ago";
  if (acquired > 0) s += ", taken " + utc_text(acquired);
  return s;
}

LeaseHolder this_process(double lease_s) {
  LeaseHolder h;
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  h.host = host;
  h.pid = static_cast<long>(getpid());
  h.job = env("SLURM_JOB_ID");
  h.array_job = env("SLURM_ARRAY_JOB_ID");
  h.array_task = env("SLURM_ARRAY_TASK_ID");
  h.restart = env("SLURM_RESTART_COUNT");
  h.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  std::error_code ec;
  h.pid_ns = fs::read_symlink("/proc/self/ns/pid", ec).string();
  h.start_ticks = process_stat(h.pid).start_ticks;
  std::random_device random;
  char nonce[33];
  std::snprintf(nonce, sizeof nonce, "%08x%08x%08x%08x", random(), random(), random(), random());
  h.nonce = nonce;
  h.acquired = h.renewed = unix_seconds();
  h.lease_s = lease_s;
  return h;
}

std::string lease_json(const LeaseHolder& h) {
  const nlohmann::json j = {{"trident_lease", 1},
                            {"host", h.host},
                            {"pid", h.pid},
                            {"slurm_job_id", h.job},
                            {"slurm_array_job_id", h.array_job},
                            {"slurm_array_task_id", h.array_task},
                            {"slurm_restart_count", h.restart},
                            {"boot_id", h.boot_id},
                            {"pid_namespace", h.pid_ns},
                            {"start_ticks", h.start_ticks},
                            {"nonce", h.nonce},
                            {"acquired", h.acquired},
                            {"renewed", h.renewed},
                            {"acquired_utc", utc_text(h.acquired)},
                            {"renewed_utc", utc_text(h.renewed)},
                            {"lease_s", h.lease_s}};
  return j.dump() + "\n";
}

LeaseHolder parse_lease(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  require(j.is_object() && j.contains("trident_lease") && j.contains("nonce"), "not a trident lease: '" + text + "'");
  LeaseHolder h;
  try {
    h.host = j.value("host", "");
    h.pid = j.value("pid", 0L);
    h.job = j.value("slurm_job_id", "");
    h.array_job = j.value("slurm_array_job_id", "");
    h.array_task = j.value("slurm_array_task_id", "");
    h.restart = j.value("slurm_restart_count", "");
    h.boot_id = j.value("boot_id", "");
    h.pid_ns = j.value("pid_namespace", "");
    h.start_ticks = j.value("start_ticks", 0ULL);
    h.nonce = j.value("nonce", "");
    h.acquired = j.value("acquired", 0.0);
    h.renewed = j.value("renewed", 0.0);
    h.lease_s = j.value("lease_s", 0.0);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("not a trident lease: ") + e.what());
  }
  return h;
}

bool holder_process_gone(const LeaseHolder& holder, const LeaseHolder& me) {
  if (holder.pid <= 0 || holder.host != me.host || holder.boot_id.empty() || holder.boot_id != me.boot_id ||
      holder.pid_ns.empty() || holder.pid_ns != me.pid_ns)
    return false;  // another machine (or container): only the lease's age can tell
  if (kill(static_cast<pid_t>(holder.pid), 0) != 0 && errno == ESRCH) return true;
  const ProcessStat p = process_stat(holder.pid);
  // Ended but not yet reaped (a rank whose launcher exited first, where PID 1 reaps late).
  if (p.state == 'Z' || p.state == 'X') return true;
  // A process of that number, but started at another time: the number was reused.
  return holder.start_ticks != 0 && p.start_ticks != 0 && p.start_ticks != holder.start_ticks;
}

LeaseVerdict judge_lease(const LeaseHolder& holder, const LeaseHolder& me, double now, double file_mtime,
                         double fallback_lease_s, bool process_gone) {
  LeaseVerdict v;
  v.age_s = std::max(0.0, now - std::max(holder.renewed, file_mtime));
  const double lease_s = holder.lease_s > 0 ? holder.lease_s : fallback_lease_s;
  if (!me.job.empty() && holder.job == me.job) {
    v.kind = LeaseVerdict::same_job;
    v.why = "the same Slurm job " + me.job + " (a requeue)";
  } else if (process_gone) {
    v.kind = LeaseVerdict::process_gone;
    v.why = "its process " + std::to_string(holder.pid) + " on this machine is gone";
  } else if (v.age_s > lease_s) {
    v.kind = LeaseVerdict::stale;
    v.why = "not renewed for " + format_seconds(v.age_s) + " (its lease_s: " + format_seconds(lease_s) + ")";
  } else {
    v.kind = LeaseVerdict::live;
    v.why = "live: stale at " + utc_text(now - v.age_s + lease_s) + " unless renewed, its lease_s being " +
            format_seconds(lease_s);
  }
  return v;
}

CheckpointLease::CheckpointLease(const std::string& dir, const Options& options)
    : CheckpointLease(dir, options, this_process(0)) {}

CheckpointLease::CheckpointLease(const std::string& dir, const Options& options, LeaseHolder me)
    : dir_(dir), path_((fs::path(dir) / kLeaseName).string()), options_(options), me_(std::move(me)) {
  me_.lease_s = lease_s();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  require(!ec || fs::is_directory(dir_), "cannot take the lease on checkpoint.dir " + dir_ +
                                             ": cannot make the folder: " + ec.message() +
                                             " (checkpoint.dir must be a writable folder)");
  acquire();
  last_write_ = Clock::now();
}

CheckpointLease::~CheckpointLease() {
  try {
    release();
  } catch (...) {  // a lease left behind goes stale; nothing to add to an ending run
  }
}

double CheckpointLease::lease_s() const {
  if (options_.lease_s > 0) return options_.lease_s;
  return std::max(options_.min_lease_s, 4 * longest_gap_s_);
}

double CheckpointLease::renew_every_s() const { return std::min(5.0, lease_s() / 4); }

std::string CheckpointLease::write_temporary() {
  me_.renewed = unix_seconds();
  me_.lease_s = lease_s();
  const std::string tmp = (fs::path(dir_) / (".LEASE." + me_.nonce + ".tmp")).string();
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const auto failed = [&](const char* what) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    throw UsageError("cannot " + std::string(what) + " the lease on checkpoint.dir " + dir_ + " (" + tmp + "): " + why +
                     " (checkpoint.dir must be a writable folder with room for checkpoints)");
  };
  if (fd < 0) failed("create");
  const std::string text = lease_json(me_);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed("write");
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) failed("sync");
  if (close(fd) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    throw UsageError("cannot write the lease on checkpoint.dir " + dir_ + " (" + tmp + "): " + why);
  }
  return tmp;
}

bool CheckpointLease::confirmed() {
  std::this_thread::sleep_for(std::chrono::duration<double>(options_.settle_s));
  const std::optional<std::string> text = read_text(path_);
  return text && holder_of(*text).nonce == me_.nonce;
}

void CheckpointLease::remove_leftovers() {
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(".LEASE.", 0) != 0) continue;
    // A temporary or a claim a minute old: its writer was killed in its moment.
    if (unix_seconds() - mtime_of(it->path().string()) > 60) fs::remove(it->path(), ec);
  }
}

void CheckpointLease::acquire() {
  for (int attempt = 0; attempt < 20; attempt++) {
    // A free folder: link() makes LEASE for one taker only.
    const std::string tmp = write_temporary();
    int linked = link(tmp.c_str(), path_.c_str());
    const int link_error = errno;
    if (linked != 0 && link_error == EEXIST) {
      // Over NFS a retried link() that had succeeded says EEXIST: the link count tells.
      struct stat st {};
      if (stat(tmp.c_str(), &st) == 0 && st.st_nlink == 2) linked = 0;
    }
    if (linked == 0 || link_error != EEXIST) unlink(tmp.c_str());
    if (linked != 0 && link_error != EEXIST)
      throw UsageError("cannot take the lease on checkpoint.dir " + dir_ + ": link " + path_ + ": " +
                       std::strerror(link_error) + " (checkpoint.dir must be a writable folder)");
    if (linked == 0) {
      sync_folder(dir_);
      if (confirmed()) {
        held_ = true;
        remove_leftovers();
        return;
      }
      continue;  // another run got it: judge its lease
    }
    // Held: by whom, and may we take it?
    const std::optional<std::string> text = read_text(path_);
    if (!text) {  // released meanwhile
      unlink(tmp.c_str());
      continue;
    }
    const double mtime = mtime_of(path_);
    const LeaseHolder holder = holder_of(*text);
    const double now = unix_seconds();
    const LeaseVerdict v = judge_lease(holder, me_, now, mtime, std::max(options_.min_lease_s, lease_s()),
                                       holder_process_gone(holder, me_));
    if (!v.may_take()) {
      unlink(tmp.c_str());
      throw UsageError("checkpoint.dir " + dir_ + " is in use by another run: " + holder.describe(now) + " (" + v.why +
                       "). One folder takes one run: give this run another --checkpoint.dir, or end that one. If "
                       "that run is gone, its lease goes stale at the time above; or remove " + path_ +
                       " once you are sure nothing writes there");
    }
    // The claim on this lease (named by its nonce): one taker at a time replaces it. A
    // claim left by a taker that died in its millisecond between claim and rename is
    // broken after 10 s.
    const std::string claim =
        (fs::path(dir_) / (".LEASE.claim." + (holder.nonce.empty() ? std::to_string(std::hash<std::string>{}(*text))
                                                                   : holder.nonce)))
            .string();
    if (link(tmp.c_str(), claim.c_str()) != 0) {
      const int error = errno;
      unlink(tmp.c_str());
      if (error != EEXIST)
        throw UsageError("cannot take over the lease on checkpoint.dir " + dir_ + ": link " + claim + ": " +
                         std::strerror(error) + " (checkpoint.dir must be a writable folder)");
      if (unix_seconds() - mtime_of(claim) > 10) unlink(claim.c_str());
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.settle_s));
      continue;  // another taker's: its lease, once in place, is judged
    }
    // Ours to replace, if it is still the lease judged.
    const std::optional<std::string> again = read_text(path_);
    bool replaced = false;
    if (again && *again == *text) {
      if (rename(tmp.c_str(), path_.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        unlink(tmp.c_str());
        unlink(claim.c_str());
        throw UsageError("cannot take over the lease on checkpoint.dir " + dir_ + ": rename to " + path_ + ": " + why +
                         " (checkpoint.dir must be a writable folder)");
      }
      sync_folder(dir_);
      replaced = true;
    }
    unlink(tmp.c_str());
    unlink(claim.c_str());
    if (replaced && confirmed()) {
      held_ = true;
      taken_over_ = holder.describe(now) + ": " + v.why;
      remove_leftovers();
      return;
    }
  }
  throw UsageError("cannot take the lease on checkpoint.dir " + dir_ +
                   ": it kept changing hands in 20 tries (other runs are starting on this folder at the same moment)");
}

bool CheckpointLease::renew(bool check_now) {
  if (!held_) return false;
  const Clock::time_point now = Clock::now();
  if (called_) {
    const double gap = std::chrono::duration<double>(now - last_call_).count();
    longest_gap_s_ = std::max(longest_gap_s_, gap);
    if (options_.lease_s > 0 && gap > options_.lease_s / 2 && !warned_gap_) {
      warned_gap_ = true;
      std::fprintf(stderr,
                   "trident: warning: a step took %.1f s, more than half of checkpoint.lease_s (%g s): another run "
                   "may judge this run's lease stale; raise --checkpoint.lease_s (0: a few step times)\n",
                   gap, options_.lease_s);
    }
  }
  called_ = true;
  last_call_ = now;
  const bool due = std::chrono::duration<double>(now - last_write_).count() >= renew_every_s();
  if (!due && !check_now) return true;
  // The renewal written first, so that its check and its rename follow each other closely
  // (a taker's rename between the two would be overwritten).
  std::string tmp;
  if (due) {
    try {
      tmp = write_temporary();
    } catch (const UsageError& e) {
      // A full disk now: the run goes on (its checkpoints will say more); the lease may go stale.
      if (!warned_write_) std::fprintf(stderr, "trident: warning: %s\n", e.what());
      warned_write_ = true;
    }
  }
  std::optional<std::string> text;
  try {
    text = read_text(path_);
  } catch (const UsageError& e) {
    if (!tmp.empty()) unlink(tmp.c_str());
    if (!warned_write_) std::fprintf(stderr, "trident: warning: %s\n", e.what());
    warned_write_ = true;
    return true;  // unreadable now: not proof that another run took it
  }
  const LeaseHolder holder = holder_of(text.value_or(""));
  if (!text || holder.nonce != me_.nonce) {
    // Taken over; or removed (by a run that took it over and ended, or by hand): this
    // run's checkpoints would now mix with another's.
    if (!tmp.empty()) unlink(tmp.c_str());
    held_ = false;
    lost_to_ = text ? "another run holds it now: " + holder.describe(unix_seconds()) : "its lease " + path_ + " was removed";
    return false;
  }
  if (tmp.empty()) return true;
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    if (!warned_write_) std::fprintf(stderr, "trident: warning: cannot renew the lease %s: %s\n", path_.c_str(),
                                     std::strerror(errno));
    warned_write_ = true;
    unlink(tmp.c_str());
    return true;
  }
  last_write_ = now;
  warned_write_ = false;
  return true;
}

void CheckpointLease::release() {
  if (!held_) return;
  held_ = false;
  const std::optional<std::string> text = read_text(path_);
  if (!text || holder_of(*text).nonce != me_.nonce) return;  // not ours any more
  if (unlink(path_.c_str()) == 0) sync_folder(dir_);
}

}  // namespace trident
