// The attention context (src/model/layers/attention_context.h): the layers that ask for
// the same settings share one piece, another setting gets its own, and each window's
// masks hold the documents' starts narrowed by that window, in each slot's place.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "model/layers/attention_context.h"

namespace trident {
namespace {

std::vector<int32_t> starts_of(kernels::Kernels& k, const SlotMasks& masks, int slot, size_t n) {
  std::vector<int32_t> host(n);
  k.copy_to_host(host.data(), masks.at(slot).doc_start, n * sizeof(int32_t));
  return host;
}

TEST(AttentionContext, LayersOfTheSameSettingsShareAPieceAndAnotherWindowHasItsOwnStarts) {
  auto k = kernels::make_cpu_kernels();
  const int T = 8, eod = 9;
  AttentionContext context(*k, T, /*micro_batch=*/2, /*slots=*/2, /*cp=*/nullptr, eod);
  EXPECT_EQ(context.ring(4, 2, 16), nullptr);  // each sequence whole here: the local kernels

  // One rotary table per setting, of this rank's positions (all of them here).
  const RotarySettings llama{.dim = 4, .theta = 500000};
  const float* table = context.rotary_table(llama);
  EXPECT_EQ(context.rotary_table(RotarySettings{.dim = 4, .theta = 500000}), table);
  EXPECT_NE(context.rotary_table(RotarySettings{.dim = 4, .theta = 10000}), table);
  std::vector<float> read(T * 4);
  k->copy_to_host(read.data(), table, read.size() * sizeof(float));
  EXPECT_EQ(read, rotary_table(llama, {0, 1, 2, 3, 4, 5, 6, 7}));

  // One set of masks per window; the window's starts are the documents' narrowed.
  const SlotMasks& whole = context.masks(0);
  const SlotMasks& window = context.masks(3);
  EXPECT_EQ(&context.masks(0), &whole);
  EXPECT_NE(&window, &whole);
  const int32_t tokens[2 * T] = {1, 2, 9, 3, 4, 5, 6, 9,   // documents at 0 and 3
                                 1, 2, 3, 4, 5, 6, 7, 8};  // one document
  context.load(/*slot=*/1, tokens, 2);
  EXPECT_EQ(starts_of(*k, whole, 1, 2 * T), (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 3,  //
                                                                   0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(starts_of(*k, window, 1, 2 * T), (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 4, 5,  //
                                                                    0, 0, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(whole.at(1).doc_start - whole.at(0).doc_start, 2 * T);  // each slot its own
  EXPECT_EQ(whole.at(0).q_pos, context.device_positions());

  // Without documents, no window: the causal mask alone; a window: starts of its own.
  AttentionContext plain(*k, T, 1, 1, nullptr, /*document_end=*/-1);
  EXPECT_EQ(plain.masks(0).at(0).doc_start, nullptr);
  const SlotMasks& pair = plain.masks(2);
  plain.load(0, tokens, 1);
  EXPECT_EQ(starts_of(*k, pair, 0, T), (std::vector<int32_t>{0, 0, 1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace trident
