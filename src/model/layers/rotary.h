// Attention's position slot: rotary embeddings (RoFormer; Llama's), each pair of a head's
// channels turned by the angle position x the pair's frequency, on q and k after the q/k
// norm. A layer's settings say how it turns; the table of cos and sin the rope kernels
// read is built from them for this rank's positions, once per stage for each distinct
// setting (attention_context.h).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace trident {

struct RotarySettings {
  int dim = 0;           // the channels of a head turned, in pairs (its head_dim)
  double theta = 10000;  // the frequency of pair i: theta^(-2i / dim)
  RopeScaling scaling = {};  // "llama3": Llama 3.1's, the long wavelengths slowed
};
// Whether two layers turn alike (and so can share a table).
bool same_rotation(const RotarySettings& a, const RotarySettings& b);

// The frequency of each of the dim / 2 pairs, scaled as configured.
std::vector<double> rotary_frequencies(const RotarySettings& s);
// cos and sin of p x frequency_i for each position p of `positions`: [positions, dim / 2,
// 2], what the rope kernels read.
std::vector<float> rotary_table(const RotarySettings& s, const std::vector<int32_t>& positions);

}  // namespace trident
