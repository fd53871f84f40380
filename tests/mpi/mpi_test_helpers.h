// Small pieces the MPI tests share.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/random.h"

namespace trident::testing_helpers {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// ||a - b|| / ||b|| (absolute when b is 0). Vectors of different sizes, or none at all,
// cannot be compared: a failure, and an error no tolerance accepts.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) {
    ADD_FAILURE() << "relative_error of " << a.size() << " values against " << b.size();
    return std::numeric_limits<double>::infinity();
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff += std::pow(static_cast<double>(a[i]) - b[i], 2);
    norm += std::pow(static_cast<double>(b[i]), 2);
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Random token ids and targets below V, the same on every rank for a given seed.
inline void random_tokens(uint64_t seed, int V, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(hash_key(seed, 1, i) % V);
    targets[i] = static_cast<int32_t>(hash_key(seed, 2, i) % V);
  }
}

}  // namespace trident::testing_helpers
