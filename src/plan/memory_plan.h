// What one rank will hold, by kind, computed before anything is allocated from the same
// layouts the run then allocates (the parameter layout, the gradient buckets, the
// activation arena, the checkpoint's host buffers), so that a run that cannot fit ends
// at once with one clear error instead of std::bad_alloc halfway through setup.
//
// Two memories: the backend's (device memory on a GPU; RAM on the CPU) and host RAM
// for what always lives on the host (the checkpoint's staging buffers). On the CPU both
// are RAM and the ranks of a node share it; on a GPU each rank's device is its own.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/kernels.h"
#include "parallel/parallel_dims.h"

namespace trident {

struct MemoryPart {
  std::string kind;     // "parameters", "gradients", "activations", ...
  std::string detail;   // how it is sized, for the report
  size_t bytes = 0;
  bool host = false;    // host RAM even when the backend is a GPU
};

struct RankMemoryPlan {
  RankCoords coords;
  std::vector<MemoryPart> parts;
  // Bytes in the backend's memory, and in host RAM only; all of it.
  size_t device_bytes() const;
  size_t host_bytes() const;
  size_t total_bytes() const { return device_bytes() + host_bytes(); }
  // The bytes of one kind (0 when absent).
  size_t of(const std::string& kind) const;
  // "parameters 0.46 GiB, gradients 0.46 GiB, ..." in plan order.
  std::string describe() const;
};

// The plan of the rank at `coords` of a run of `config` (resolved for its world: dp and
// micro_batch set) on backend `k`. A node leader writes its node's checkpoint file and
// collects `node_leader_receives` bytes of pieces from the node's other ranks.
// device_only: leave out what lives in host RAM only (a plan for GPUs: `trident plan`).
// partner_copies: the memory tier keeps a partner node's snapshots too (a run of one node
// has none).
RankMemoryPlan plan_rank_memory(const Config& config, const RankCoords& coords, const kernels::Footprint& k,
                                bool node_leader = true, size_t node_leader_receives = 0, bool device_only = false,
                                bool partner_copies = true);

// The checkpoint pieces a rank hands its node leader (0 without checkpoint.dir).
size_t checkpoint_piece_bytes(const Config& config, const RankCoords& coords);

// The largest plan over every rank coordinate of the grid (the busiest rank).
RankMemoryPlan busiest_rank_plan(const Config& config, const kernels::Footprint& k);

double gib(double bytes);

// A run takes more than its plan by more than this share: a warning says where.
inline constexpr double kMemoryOverPlanWarning = 0.10;

// Where a rank that took `taken` bytes against `planned` of `plan` (its total; on a GPU its
// device part) went beyond its plan: the
// parts measured beyond what the plan counts for their kind (`beyond`: kind, detail, bytes),
// then the rest, which no part accounts for. "" within kMemoryOverPlanWarning of the plan.
std::string beyond_plan(const RankMemoryPlan& plan, size_t planned, size_t taken, const std::vector<MemoryPart>& beyond);

}  // namespace trident
