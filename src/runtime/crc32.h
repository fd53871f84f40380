// CRC-32 (zlib's) of a block in memory, continued from `crc` (0 to start): zlib takes a
// 32-bit length, so a block of 4 GiB or more goes in slices.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace trident {

inline uint32_t crc32_of(uint32_t crc, const void* data, size_t bytes) {
  const auto* at = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const auto n = static_cast<uInt>(std::min<size_t>(bytes, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, at, n));
    at += n;
    bytes -= n;
  }
  return crc;
}

}  // namespace trident
