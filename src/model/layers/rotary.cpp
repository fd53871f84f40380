#include "model/layers/rotary.h"

#include <cmath>
#include <numbers>

namespace trident {

bool same_rotation(const RotarySettings& a, const RotarySettings& b) {
  const RopeScaling &x = a.scaling, &y = b.scaling;
  return a.dim == b.dim && a.theta == b.theta && x.type == y.type &&
         (x.type == "none" || (x.factor == y.factor && x.low_freq_factor == y.low_freq_factor &&
                               x.high_freq_factor == y.high_freq_factor &&
                               x.original_max_position == y.original_max_position));
}

std::vector<double> rotary_frequencies(const RotarySettings& s) {
  const int pairs = s.dim / 2;
  std::vector<double> freq(pairs);
  for (int i = 0; i < pairs; i++) freq[i] = std::pow(s.theta, -2.0 * i / s.dim);
  const RopeScaling& r = s.scaling;
  if (r.type != "llama3") return freq;
  // Llama 3.1 (Hugging Face's _compute_llama3_parameters): wavelengths longer than the
  // original context / low_freq_factor slow down by `factor`, shorter than
  // context / high_freq_factor stay, and those between blend smoothly.
  const double low_wavelen = r.original_max_position / r.low_freq_factor;
  const double high_wavelen = r.original_max_position / r.high_freq_factor;
  for (double& f : freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (r.original_max_position / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return freq;
}

std::vector<float> rotary_table(const RotarySettings& s, const std::vector<int32_t>& positions) {
  const std::vector<double> freq = rotary_frequencies(s);
  const size_t pairs = freq.size();
  std::vector<float> table(positions.size() * pairs * 2);
  for (size_t row = 0; row < positions.size(); row++)
    for (size_t i = 0; i < pairs; i++) {
      const double angle = positions[row] * freq[i];
      table[(row * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      table[(row * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  return table;
}

}  // namespace trident
