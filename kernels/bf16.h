// bfloat16 <-> float conversion, bit-exact and usable on the host and in CUDA code, so
// the CPU tests check the very rounding the GPU path uses. bf16 is the top half of an
// IEEE float: 8 exponent bits, 7 mantissa bits.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define TRIDENT_HOST_DEVICE __host__ __device__
#else
#define TRIDENT_HOST_DEVICE
#endif

namespace trident::kernels {

// Round to nearest, ties to even (what __float2bfloat16 and PyTorch do); NaN stays a
// (quiet) NaN instead of rounding up into infinity.
TRIDENT_HOST_DEVICE inline uint16_t float_to_bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

TRIDENT_HOST_DEVICE inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// x rounded to the nearest bf16 value, kept in a float.
TRIDENT_HOST_DEVICE inline float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace trident::kernels
