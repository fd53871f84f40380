#include "config/choices.h"

#include "kernels/base/error.h"

namespace trident {

void throw_bad_choice(const char* key, const std::string& choices, std::string_view text) {
  throw UsageError(std::string(key) + " must be " + choices + ", got '" + std::string(text) + "'");
}

}  // namespace trident
