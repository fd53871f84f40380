// CRC-32 (zlib's) of a block in memory, continued from `crc` (0 to start): zlib takes a
// 32-bit length, so a block of 4 GiB or more goes in slices.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

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

// CRC-32C (Castagnoli) of a block, continued from `crc` (0 to start): the instruction
// x86-64 (SSE4.2) and ARMv8 have for it, several times zlib's CRC-32 speed, for checks of
// gigabytes that a step waits for (the memory tier's snapshots); a table elsewhere.
inline uint32_t crc32c_of(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__) || defined(__ARM_FEATURE_CRC32)
  uint64_t wide = c;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
#if defined(__SSE4_2__)
    wide = _mm_crc32_u64(wide, v);
#else
    wide = __crc32cd(static_cast<uint32_t>(wide), v);
#endif
  }
  c = static_cast<uint32_t>(wide);
#endif
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t v = i;
      for (int k = 0; k < 8; k++) v = (v >> 1) ^ (0x82F63B78u & (0u - (v & 1u)));
      t[i] = v;
    }
    return t;
  }();
  for (; bytes > 0; bytes--, p++) c = table[(c ^ *p) & 0xFF] ^ (c >> 8);
  return ~c;
}

}  // namespace trident
