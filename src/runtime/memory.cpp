#include "runtime/memory.h"

#include <malloc.h>

#include <fstream>
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

}  // namespace

size_t resident_bytes() { return read_status_kib("VmRSS"); }
size_t peak_resident_bytes() { return read_status_kib("VmHWM"); }

void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);         // serve every block from the heap, never from mmap
  mallopt(M_TRIM_THRESHOLD, -1);  // and never give the heap back
}

}  // namespace trident
