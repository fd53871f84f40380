// exp and tanh that GCC vectorizes inside `#pragma omp simd` loops (glibc's expf/tanhf
// stay scalar without -ffast-math). Accurate to a few float ulps; the double versions
// are the standard library's, so finite-difference tests see exact math.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace trident::kernels::cpu {

// exp(x) = 2^n * exp(r), |r| <= ln2/2, with Cephes' degree-6 polynomial for exp(r).
#pragma omp declare simd
inline float fast_exp(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  return e * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

#pragma omp declare simd
inline double fast_exp(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (exp(2u) + 1); absolute error ~1e-7, which is what GELU needs.
#pragma omp declare simd
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

#pragma omp declare simd
inline double fast_tanh(double u) { return std::tanh(u); }

}  // namespace trident::kernels::cpu
