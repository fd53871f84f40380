// Counter-based random numbers: a value depends only on its key (seed, stream, index),
// not on how many draws came before, so any rank can produce any slice of a tensor or
// any sample of a batch and get the same numbers under every parallel layout.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace trident {

// SplitMix64's finalizer: a bijective mix of 64 bits.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash_key(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// FNV-1a, to turn a tensor name into a stream id.
inline uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1), from the top 53 bits.
inline double uniform_open(uint64_t bits) { return ((bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

// Standard normal for key (seed, stream, index), by Box-Muller.
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform_open(hash_key(seed, stream, 2 * index));
  const double u2 = uniform_open(hash_key(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace trident
