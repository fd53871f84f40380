// What the checkpoint tests compare: two checkpoints, tensor by tensor.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ckpt/checkpoint.h"

namespace trident {

// Every tensor of every kind (parameters, the optimizer's state) of two checkpoints,
// compared exactly.
inline void expect_identical(const std::string& a, const std::string& b) {
  const Manifest ma = read_manifest(a), mb = read_manifest(b);
  ASSERT_EQ(ma.optimizer_state, mb.optimizer_state);
  std::vector<std::string> kinds = {"params"};
  kinds.insert(kinds.end(), ma.optimizer_state.begin(), ma.optimizer_state.end());
  for (const std::string& kind : kinds) {
    const auto ta = read_canonical(ma, kind), tb = read_canonical(mb, kind);
    ASSERT_FALSE(ta.empty()) << kind << " of " << a;
    ASSERT_EQ(ta.size(), tb.size()) << kind;
    for (size_t i = 0; i < ta.size(); i++) EXPECT_EQ(ta[i].second, tb[i].second) << kind << " " << ta[i].first;
  }
}

}  // namespace trident
