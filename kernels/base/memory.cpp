#include "kernels/base/memory.h"

#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

namespace trident {

namespace {

// A "Key: N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in bytes.
size_t read_kib_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

// A number in a file ("max" or absent: none).
std::optional<size_t> read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return static_cast<size_t>(std::stoull(text));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A key of a cgroup's memory.stat (bytes; 0 when absent).
size_t read_stat(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string name;
  size_t value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return 0;
}

// Usage less the inactive file pages (page cache the kernel reclaims first).
std::optional<size_t> working_set(const std::string& dir, std::optional<size_t> usage, const std::string& key) {
  if (!usage) return usage;
  const size_t reclaimable = read_stat(dir + "/memory.stat", key);
  return *usage > reclaimable ? *usage - reclaimable : 0;
}

// The tightest memory limit over this process's cgroup and its ancestors (a Slurm job's
// limit sits on job_N, above the step's and task's cgroups), v1 or v2, as the limit and
// what that cgroup holds now. A cgroup path that is not mounted as such (a container
// without a cgroup namespace) falls back to the mount's root.
struct CgroupMemory {
  std::optional<size_t> limit, usage;
};

CgroupMemory tightest_limit(const std::string& mount, std::string path, const std::string& limit_file,
                            const std::string& usage_file, const std::string& inactive_key) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(mount + path)) path = "/";
  CgroupMemory best;
  size_t best_room = std::numeric_limits<size_t>::max();
  for (fs::path p = path;; p = p.parent_path()) {
    const std::string dir = mount + (p.string() == "/" ? "" : p.string());
    const std::optional<size_t> limit = read_limit(dir + "/" + limit_file);
    if (limit && *limit < (size_t{1} << 60)) {  // v1 writes "unlimited" as a huge number
      const std::optional<size_t> usage = working_set(dir, read_limit(dir + "/" + usage_file), inactive_key);
      const size_t room = *limit > usage.value_or(0) ? *limit - usage.value_or(0) : 0;
      if (room < best_room) best_room = room, best = {limit, usage};
    }
    if (p == p.root_path() || p.empty()) break;
  }
  return best;
}

CgroupMemory cgroup_memory() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line, v1, v2;
  while (std::getline(cgroup, line)) {
    const size_t colon = line.find(':'), second = line.find(':', colon + 1);
    if (colon == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(colon + 1, second - colon - 1), path = line.substr(second + 1);
    if (controllers.empty()) v2 = path;
    else if (("," + controllers + ",").find(",memory,") != std::string::npos) v1 = path;
  }
  if (!v1.empty())  // a v1 memory controller (hybrid hierarchies have both)
    return tightest_limit("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file");
  if (!v2.empty()) return tightest_limit("/sys/fs/cgroup", v2, "memory.max", "memory.current", "inactive_file");
  return {};
}

}  // namespace

size_t available_memory_bytes() {
  size_t available = read_kib_field("/proc/meminfo", "MemAvailable");
  const CgroupMemory cg = cgroup_memory();
  if (cg.limit) available = std::min(available, *cg.limit > cg.usage.value_or(0) ? *cg.limit - cg.usage.value_or(0) : 0);
  return available;
}

size_t total_memory_bytes() {
  const size_t total = read_kib_field("/proc/meminfo", "MemTotal");
  const CgroupMemory cg = cgroup_memory();
  return cg.limit ? std::min(total, *cg.limit) : total;
}

size_t resident_bytes() { return read_kib_field("/proc/self/status", "VmRSS"); }
size_t peak_resident_bytes() { return read_kib_field("/proc/self/status", "VmHWM"); }

bool reset_peak_resident() {
  malloc_trim(0);  // freed heap pages would otherwise be reused unseen by the peak
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);         // serve every block from the heap, never from mmap
  mallopt(M_TRIM_THRESHOLD, -1);  // and never give the heap back
}

void release_freed_memory() { malloc_trim(0); }

}  // namespace trident
