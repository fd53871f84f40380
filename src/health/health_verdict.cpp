#include "health/health_verdict.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "runtime/wall_clock.h"

namespace fs = std::filesystem;

namespace trident::health {

namespace {

std::string& folder_path() {
  static std::string folder;  // <checkpoint.dir>/health, once set
  return folder;
}

std::string job_id() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id != nullptr && *id != '\0' ? id : "local";
}

// This job's verdict in the folder set by set_checkpoint_dir.
std::string verdict_file() { return (fs::path(folder_path()) / (job_id() + ".json")).string(); }

}  // namespace

std::string node_name() {
  if (const char* given = std::getenv("TRIDENT_NODE_NAME"); given != nullptr && *given != '\0') return given;
  if (const char* slurm = std::getenv("SLURMD_NODENAME"); slurm != nullptr && *slurm != '\0') return slurm;
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const std::string h = host;
  return h.substr(0, h.find('.'));
}

std::string verdict_path(const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return "";
  return (fs::path(checkpoint_dir) / "health" / (job_id() + ".json")).string();
}

void set_checkpoint_dir(const std::string& checkpoint_dir) {
  folder_path().clear();
  if (checkpoint_dir.empty()) return;
  const fs::path folder = fs::path(checkpoint_dir) / "health";
  std::error_code ec;
  fs::create_directories(folder, ec);
  const std::string probe = (folder / (".probe-" + node_name() + "-" + std::to_string(getpid()))).string();
  std::ofstream out(probe);
  out << "trident";
  out.close();
  const bool written = out.good();
  fs::remove(probe, ec);
  require(written, "cannot write health verdicts to " + folder.string() +
                       (ec ? ": " + ec.message() : std::string(": ") + std::strerror(errno)) +
                       " (checkpoint.dir must be writable: the batch script reads a failed host's name there)");
  folder_path() = folder.string();
}

std::string to_json(const Verdict& v) {
  const nlohmann::json j = {{"job", job_id()}, {"host", v.host},         {"ranks", v.ranks},
                            {"reason", v.reason}, {"evidence", v.evidence}, {"time", utc_text(unix_seconds())}};
  return j.dump(2) + "\n";
}

Verdict from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  Verdict v;
  v.host = j.value("host", "");
  v.ranks = j.value("ranks", std::vector<int>{});
  v.reason = j.value("reason", "");
  v.evidence = j.value("evidence", "");
  return v;
}

bool write(const Verdict& v) {
  if (folder_path().empty()) return false;
  const std::string path = verdict_file();
  // A name of this process's own: ranks of one machine that time out together each write
  // theirs whole, and the last rename wins.
  const std::string tmp = path + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(v);
    out.flush();
    if (!out.good()) {
      std::fprintf(stderr, "trident: error: cannot write the health verdict %s (disk full?): %s\n", tmp.c_str(),
                   std::strerror(errno));
      return false;
    }
  }
  // link() fails where the name exists: the first verdict stays.
  const bool linked = link(tmp.c_str(), path.c_str()) == 0;
  const int why = errno;
  std::remove(tmp.c_str());
  if (!linked) {
    if (why == EEXIST) return false;
    std::fprintf(stderr, "trident: error: cannot write the health verdict %s: %s\n", path.c_str(), std::strerror(why));
    return false;
  }
  std::fprintf(stderr, "trident: health verdict on %s: %s (written to %s)\n", v.host.c_str(), v.reason.c_str(),
               path.c_str());
  std::fflush(stderr);
  return true;
}

void clear() {
  if (folder_path().empty()) return;
  std::error_code ec;
  fs::remove(verdict_file(), ec);
}

}  // namespace trident::health
