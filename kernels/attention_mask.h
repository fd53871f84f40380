// Which keys each query row of attention sees, by the tokens' positions, so that one
// kernel serves plain causal attention, documents packed into one sequence (document
// masking) and a rank's share of a sequence under context parallelism (its rows are not
// positions 0..T-1, and another rank's keys arrive in blocks):
//
//   key j is visible to query i of sequence b  iff  kv_pos[j] <= q_pos[i]
//                                               and kv_pos[j] >= doc_start[b * Tq + i]
//
// q_pos [Tq] and kv_pos [Tk] are global positions, strictly increasing (the kernels find
// each block's visible keys by binary search and skip the rest); doc_start [B, Tq] is the
// position where each query's document begins, nondecreasing along a row and at most
// the query's own position; null: no document mask. Device memory (int32), as the
// activations. The mask itself never exists as T x T.
#pragma once

#include <cstdint>

namespace trident::kernels {

struct AttentionMask {
  const int32_t* q_pos = nullptr;
  const int32_t* kv_pos = nullptr;
  const int32_t* doc_start = nullptr;
};

}  // namespace trident::kernels
