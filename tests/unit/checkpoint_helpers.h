// What the checkpoint tests compare: two checkpoints, tensor by tensor.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ckpt/checkpoint.h"

namespace trident {

// Every tensor of every kind (parameters, both moments) of two checkpoints, compared exactly.
inline void expect_identical(const std::string& a, const std::string& b) {
  const Manifest ma = read_manifest(a), mb = read_manifest(b);
  for (const char* kind : {"params", "exp_avg", "exp_avg_sq"}) {
    const auto ta = read_canonical(ma, kind), tb = read_canonical(mb, kind);
    ASSERT_FALSE(ta.empty()) << kind << " of " << a;
    ASSERT_EQ(ta.size(), tb.size()) << kind;
    for (size_t i = 0; i < ta.size(); i++) EXPECT_EQ(ta[i].second, tb[i].second) << kind << " " << ta[i].first;
  }
}

}  // namespace trident
