#pragma once

#include <cstdio>
#include <string>

namespace trident {

// A size for a person to read, in decimal units as the GB/s rates beside it: "1.074 GB",
// "23.4 MB", "5.2 KB", "512 bytes" (a small copy is not "0.000 GB").
inline std::string byte_size(double bytes) {
  char text[32];
  if (bytes >= 1e9)
    std::snprintf(text, sizeof text, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(text, sizeof text, "%.1f KB", bytes / 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  return text;
}

}  // namespace trident
