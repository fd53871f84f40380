#include "runtime/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/base/error.h"

namespace trident {

void sync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  require(fd >= 0, "cannot open '" + path + "' to sync it");
  const int rc = fsync(fd);
  close(fd);
  require(rc == 0, "cannot sync '" + path + "': " + std::strerror(errno));
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    require(out.good(), "cannot write '" + tmp + "' (disk full?)");
  }
  sync_path(tmp);
  std::filesystem::rename(tmp, path);
  const std::string folder = std::filesystem::path(path).parent_path().string();
  sync_path(folder.empty() ? "." : folder);
}

}  // namespace trident
