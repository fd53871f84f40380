#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace trident {

// [begin, end) of a flat buffer, in elements.
struct FlatRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// `ranges` (in order) cut wherever one of `runs` begins or ends inside them: a piece lies
// either within a run or outside every run (expert parallelism: the experts' tensors and
// the others are reduced over different groups).
inline std::vector<FlatRange> split_at(const std::vector<FlatRange>& ranges, const std::vector<FlatRange>& runs) {
  std::vector<FlatRange> pieces;
  for (const FlatRange& r : ranges) {
    size_t begin = r.begin;
    for (const FlatRange& run : runs)
      for (size_t edge : {run.begin, run.end})
        if (edge > begin && edge < r.end) {
          pieces.push_back({begin, edge});
          begin = edge;
        }
    pieces.push_back({begin, r.end});
  }
  return pieces;
}

// Where each of `ranges` starts among its `pieces` (split_at's of them): range r's pieces
// are pieces[first[r] .. first[r + 1]).
inline std::vector<size_t> first_pieces(const std::vector<FlatRange>& ranges, const std::vector<FlatRange>& pieces) {
  std::vector<size_t> first;
  for (size_t r = 0, p = 0; r < ranges.size(); r++) {
    first.push_back(p);
    while (p < pieces.size() && pieces[p].end <= ranges[r].end) p++;
  }
  first.push_back(pieces.size());
  return first;
}

// Whether `piece` (of split_at's) lies within one of the runs.
inline bool within(const FlatRange& piece, const std::vector<FlatRange>& runs) {
  return std::any_of(runs.begin(), runs.end(),
                     [&](const FlatRange& r) { return piece.begin >= r.begin && piece.end <= r.end; });
}

}  // namespace trident
