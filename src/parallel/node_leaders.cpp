#include "parallel/node_leaders.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "parallel/agreement.h"

namespace fs = std::filesystem;

namespace trident {

NodeLeaders node_leaders(ParallelState& parallel) {
  std::vector<double> is_leader(parallel.world().size(), 0.0);
  is_leader[parallel.rank()] = parallel.node().rank() == 0 ? 1.0 : 0.0;
  parallel.world().all_reduce(std::span<double>(is_leader));
  NodeLeaders l;
  l.leader = parallel.node().rank() == 0;
  for (int r = 0; r < parallel.world().size(); r++) {
    if (r < parallel.rank()) l.index += static_cast<int>(is_leader[r]);
    l.count += static_cast<int>(is_leader[r]);
  }
  return l;
}

bool shared_folder(ParallelState& parallel, const std::string& folder) {
  std::string probe;
  if (parallel.is_root()) {
    fs::create_directories(folder);
    probe = (fs::path(folder) / (".shared-probe-" + std::to_string(std::random_device{}()))).string();
    std::ofstream(probe) << "trident\n";
  }
  probe = broadcast_string(probe);
  const bool seen = parallel.node().rank() != 0 || fs::exists(probe);
  const bool all = parallel.world().all_reduce(seen ? 0.0 : 1.0, ReduceOp::max) == 0;
  if (parallel.is_root()) fs::remove(probe);
  return all;
}

}  // namespace trident
