#include "runtime/memory.h"

#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>

namespace trident {

namespace {

size_t read_status_kib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

size_t read_meminfo_kib(const std::string& key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line))
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

// This process's memory cgroup: its limit and what it holds now (v2, else v1).
struct CgroupMemory {
  std::optional<size_t> limit, usage;
};

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
  if (!v1.empty()) {  // a v1 memory controller (hybrid hierarchies have both)
    const std::string dir = "/sys/fs/cgroup/memory" + v1;
    CgroupMemory m{read_limit(dir + "/memory.limit_in_bytes"),
                   working_set(dir, read_limit(dir + "/memory.usage_in_bytes"), "total_inactive_file")};
    if (m.limit && *m.limit >= (size_t{1} << 60)) m.limit.reset();  // v1's "unlimited"
    return m;
  }
  if (!v2.empty()) {
    const std::string dir = "/sys/fs/cgroup" + v2;
    return {read_limit(dir + "/memory.max"), working_set(dir, read_limit(dir + "/memory.current"), "inactive_file")};
  }
  return {};
}

}  // namespace

size_t available_memory_bytes() {
  size_t available = read_meminfo_kib("MemAvailable");
  const CgroupMemory cg = cgroup_memory();
  if (cg.limit) available = std::min(available, *cg.limit > cg.usage.value_or(0) ? *cg.limit - cg.usage.value_or(0) : 0);
  return available;
}

size_t total_memory_bytes() {
  const size_t total = read_meminfo_kib("MemTotal");
  const CgroupMemory cg = cgroup_memory();
  return cg.limit ? std::min(total, *cg.limit) : total;
}

size_t resident_bytes() { return read_status_kib("VmRSS"); }
size_t peak_resident_bytes() { return read_status_kib("VmHWM"); }

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

}  // namespace trident
