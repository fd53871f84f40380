#include "kernels/base/error.h"

#include <unistd.h>

namespace trident {

void fail(const std::string& what, std::source_location where) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  throw std::runtime_error(what + " (host " + host + ", " + where.file_name() + ":" +
                           std::to_string(where.line()) + ")");
}

}  // namespace trident
