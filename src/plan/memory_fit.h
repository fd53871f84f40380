// The check every rank makes before allocating: its memory plan (plan/memory_plan.h)
// against the memory it draws on, summed over the ranks that share that memory (the
// node's RAM on the CPU; a GPU's memory per device). A run that cannot fit ends at once
// on every rank: UsageError (exit 2) with the total, the largest parts, and the changes
// of layout that would fit.
#pragma once

#include "config/config.h"
#include "kernels/kernels.h"
#include "parallel/parallel_state.h"
#include "plan/memory_plan.h"

namespace trident {

// What the run may take of the free memory: the rest is for what no plan counts
// (libraries, MPI's and NCCL's own buffers, transient host copies).
constexpr double kUsableFraction = 0.95;

// This rank's plan, checked (collective over the world). Throws AgreedUsageError on
// every rank when any rank's memory is short.
RankMemoryPlan check_memory_fits(const Config& config, ParallelState& parallel, const kernels::Kernels& k);

}  // namespace trident
