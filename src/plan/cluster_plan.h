// `trident plan`: for a model and a cluster of GPUs that need not be here, every layout
// (dp, tp, cp, pp, ZeRO stage, recompute, micro-batch) whose busiest rank fits its GPU, with
// that rank's memory from the memory plan (plan/memory_plan.h, with the CUDA backend's
// footprint) and a predicted step time, fastest first.
//
// The step time model, per step of the busiest pipeline stage:
//   compute   each micro-batch's forward (F), input-gradient (B) and weight-gradient (W)
//             passes over the stage's layers and head, from the shapes of their GEMMs,
//             flash attention and the memory-bound kernels (plan/layer_time.h), plus what
//             recomputation reruns before the backward;
//   tp        4 all-reduces of B*T*d bf16 per layer and micro-batch (5 with full
//             recompute: the rerun stops before the MLP's output projection), over
//             NVLink, not overlapped (Megatron's default); with context parallelism (cp)
//             T is a rank's T/cp tokens, its attention 1/cp of the sequence's, and the
//             ring's key/value blocks (cp - 1 forward, 2 cp - 1 backward per layer) count
//             here where a block's attention cannot hide them;
//   pipeline  the schedule's bubble and transfers on the critical path
//             (plan/schedule_time.h: 1F1B, GPipe, interleaved, zero bubble);
//   dp        (dp x cp under context parallelism) what trident sends: fp32 gradients (all-reduce; ZeRO: reduce-scatter, the
//             blocks' per micro-batch under ZeRO-2/3, the kept embeddings and head once
//             after backward), the fp32 parameter all-gather after the step (ZeRO-1/2),
//             ZeRO-3's bf16 gathers before each block's forward and backward and of the
//             kept units after the update; over NVLink when the dp group is within a node,
//             else over the network; only what the compute that overlaps it cannot hide
//             is counted;
//   optimizer the update's bytes (optim/optimizer.h) over the parameters this rank updates,
//            at 80% of HBM bandwidth.
// The rates are stated in plan/hardware.cpp and checked against published runs
// (tests/unit/test_cluster_plan.cpp, benchmarks/RESULTS.md).
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "plan/hardware.h"
#include "plan/layer_time.h"
#include "plan/layout_pins.h"
#include "plan/memory_plan.h"

namespace trident {

struct Cluster {
  int nodes = 1, gpus_per_node = 8;
  GpuModel gpu;
  NetworkModel network;
  int world() const { return nodes * gpus_per_node; }
};

struct StepPrediction {
  double compute_s = 0, tp_s = 0, bubble_s = 0, pp_s = 0, dp_s = 0, dp_exposed_s = 0, optimizer_s = 0;
  double ep_s = 0;  // expert parallelism's all-to-all exchanges (not hidden)
  double forward_s = 0, input_grad_s = 0, weight_grad_s = 0;  // one micro-batch on the busiest stage, tp included
  double step_s = 0;
  double tokens_per_s = 0;  // the whole cluster's
  double mfu = 0;           // model FLOPs (without recomputation) over the cluster's dense peak
};

// The predicted step of `config` (its layout resolved for the cluster's world) on `cluster`.
StepPrediction predict_step(const Config& config, const Cluster& cluster, const StepModelOptions& options = {});

struct PlannedLayout {
  Config config;         // resolved: dp, tp, pp, schedule, vpp, zero, recompute, micro_batch set
  RankMemoryPlan memory; // the busiest rank's, in device memory
  StepPrediction step;
  std::string flags;     // what to add to the config's command line
};

// Every layout of `config` on `cluster` whose busiest rank fits in the GPU's memory
// (95% of it), fastest first (within 0.5%: the lower ZeRO stage, the simpler schedule,
// then the less memory); the keys in `pins` keep their values in `config`.
// UsageError when the cluster or the model cannot work, or the pinned keys cannot (naming
// them, and what breaks: a rule of the layout, or the memory it takes).
std::vector<PlannedLayout> plan_cluster(const Config& config, const Cluster& cluster, const LayoutPins& pins = {});

}  // namespace trident
