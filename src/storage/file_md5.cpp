#include "storage/file_md5.h"

#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

#include "kernels/base/error.h"
#include "runtime/exit_codes.h"

namespace trident {

std::string file_md5(const std::string& path, const std::function<bool()>& stop) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) throw InfrastructureError("cannot read " + path + " for its MD5");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  check(ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_md5(), nullptr) == 1, "EVP_DigestInit_ex failed");
  std::vector<char> block(8 << 20);
  while (in) {
    if (stop && stop()) throw InfrastructureError(path + ": its MD5 was not taken (cancelled)");
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; i++) {
    hex += "0123456789abcdef"[digest[i] >> 4];
    hex += "0123456789abcdef"[digest[i] & 15];
  }
  return hex;
}

}  // namespace trident
