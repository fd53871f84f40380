// How the ranks of a machine share its cores, as rank 0 reports it at start. More
// threads than cores make the ranks take turns: a step then takes many times as long
// (4 ranks x 2 threads on 2 cores: 10x), and each rank's work time depends on the
// others' turns, so straggler reports mean nothing.
#pragma once

#include <string>

#include "parallel/parallel_state.h"

namespace trident {

struct CoreSharing {
  int ranks = 1, threads_per_rank = 1, cores = 1;  // the most ranks and threads, the fewest cores of any machine
  int threads() const { return ranks * threads_per_rank; }
  // Several threads per rank and more threads than cores: a fix is to give each rank fewer.
  bool threads_oversubscribe() const { return threads_per_rank > 1 && threads() > cores; }
  // More ranks than cores (one machine standing in for a cluster): they take turns.
  bool ranks_take_turns() const { return ranks > cores; }
  // What rank 0 prints about it at start ("" when the cores suffice).
  std::string advice() const;
};

// Collective over the world: the same answer on every rank.
CoreSharing core_sharing(ParallelState& parallel);

}  // namespace trident
