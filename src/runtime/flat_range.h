#pragma once

#include <cstddef>

namespace trident {

// [begin, end) of a flat buffer, in elements.
struct FlatRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

}  // namespace trident
