#include "config/choices.h"

#include "kernels/base/error.h"

namespace trident {

std::string join_choices(const char* const* names, size_t count) {
  std::string s;
  for (size_t i = 0; i < count; i++) {
    if (i > 0) s += i + 1 == count ? " or " : ", ";
    s += names[i];
  }
  return s;
}

void throw_bad_choice(const char* key, const std::string& choices, std::string_view text) {
  throw UsageError(std::string(key) + " must be " + choices + ", got '" + std::string(text) + "'");
}

}  // namespace trident
