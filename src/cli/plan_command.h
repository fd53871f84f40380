#pragma once

#include <string>
#include <vector>

namespace trident {

// `trident plan --config F --nodes N --gpus_per_node G --gpu a100|h100|h200 [--network efa|ib|GBPS]
// [--top K]`: the layouts of F's model and batch that fit the cluster, ranked by predicted
// tokens/s (plan/cluster_plan.h), and the sbatch line of the best. No GPU needed. Runs on
// rank 0 alone; returns the exit code (bad input: UsageError).
int run_plan_command(const std::vector<std::string>& args);

}  // namespace trident
