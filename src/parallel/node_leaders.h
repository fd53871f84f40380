// The node leaders (each node's rank 0: ParallelState::node()) fetch files for their
// node's ranks; where the folder is one file system that every node sees, they share the
// fetching out instead of each fetching everything.
#pragma once

#include <string>

#include "parallel/parallel_state.h"

namespace trident {

struct NodeLeaders {
  int count = 0;  // node leaders in the job
  int index = 0;  // this rank's place among them (meaningful on a leader)
  bool leader = false;
};

// Collective over the world.
NodeLeaders node_leaders(ParallelState& parallel);

// Collective over the world: whether every node leader sees `folder` as rank 0 does (a
// shared file system). Rank 0 leaves a file of a random name there, and every leader
// looks for it.
bool shared_folder(ParallelState& parallel, const std::string& folder);

}  // namespace trident
