#include "config/choices.h"

#include "config/did_you_mean.h"
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

void throw_bad_choice(const char* key, const char* const* names, size_t count, std::string_view text) {
  const std::string meant = closest_choice(text, names, count);
  throw UsageError(std::string(key) + " must be " + join_choices(names, count) + ", got '" + std::string(text) + "'" +
                   (meant.empty() ? "" : " (did you mean " + meant + "?)"));
}

}  // namespace trident
