// `trident plan`: for a model and a cluster of GPUs that need not be here, every layout
// (dp, tp, pp, ZeRO stage, recompute, micro-batch) whose busiest rank fits its GPU, with
// that rank's memory from the memory plan (plan/memory_plan.h, with the CUDA backend's
// footprint) and a predicted step time, fastest first.
//
// The step time model, per step of the busiest pipeline stage:
//   compute   the stage's FLOPs (6N + 12 L T d per token, plus what recomputation
//             repeats) at the GPU's dense bf16 peak times its stated efficiency;
//   tp        4 all-reduces of B*T*d bf16 per layer and micro-batch (5 with full
//             recompute: the rerun stops before the MLP's output projection), over
//             NVLink, not overlapped (Megatron's default);
//   pipeline  (m + pp - 1) micro-batch slots for m micro-batches (1F1B or GPipe), and
//             2 (pp - 1) activation transfers on the critical path (fill and drain);
//   dp        what trident sends: fp32 gradients (all-reduce; ZeRO: reduce-scatter, the
//             blocks' per micro-batch under ZeRO-2/3, the kept embeddings and head once
//             after backward), the fp32 parameter all-gather after the step (ZeRO-1/2),
//             ZeRO-3's bf16 gathers before each block's forward and backward and of the
//             kept units after the update; over NVLink when the dp group is within a node,
//             else over the network; only what the compute that overlaps it cannot hide
//             is counted;
//   optimizer AdamW over the parameters this rank updates, at 80% of HBM bandwidth.
// The efficiencies and bandwidths are stated in the GPU and network tables (cluster_plan.cpp)
// and checked against published runs (tests/unit/test_cluster_plan.cpp, benchmarks/RESULTS.md).
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "plan/memory_plan.h"

namespace trident {

struct GpuModel {
  std::string name;            // as on the command line: a100, h100, h200
  std::string description;     // "A100 SXM 80GB"
  double bf16_tflops = 0;      // dense, datasheet
  double memory_gib = 0;       // device memory
  double hbm_tbps = 0;         // memory bandwidth, TB/s
  double nvlink_gbps = 0;      // NCCL all-reduce bus bandwidth among the node's GPUs, GB/s
  double efficiency = 0;       // the share of the dense peak a training step's compute reaches
  std::string default_network;
};
// UsageError naming the known ones.
const GpuModel& gpu_model(const std::string& name);

struct NetworkModel {
  std::string name;
  double gbps_per_gpu = 0;  // line rate between nodes, Gbit/s per GPU
  double efficiency = 0.8;  // of the line rate that a ring all-reduce's bus bandwidth reaches
  double bus_bytes_per_s() const { return gbps_per_gpu * 1e9 / 8 * efficiency; }
};
// "efa" (the GPU's AWS instance: p4d 400 Gbit/s per node, p5/p5e 3200), "ib" (InfiniBand
// HDR/NDR, one 200 or 400 Gbit/s port per GPU), or a number: Gbit/s per GPU. UsageError else.
NetworkModel network_model(const std::string& name, const GpuModel& gpu);

struct Cluster {
  int nodes = 1, gpus_per_node = 8;
  GpuModel gpu;
  NetworkModel network;
  int world() const { return nodes * gpus_per_node; }
};

struct StepPrediction {
  double compute_s = 0, tp_s = 0, bubble_s = 0, pp_s = 0, dp_s = 0, dp_exposed_s = 0, optimizer_s = 0;
  double step_s = 0;
  double tokens_per_s = 0;  // the whole cluster's
  double mfu = 0;           // model FLOPs (without recomputation) over the cluster's dense peak
};

struct StepModelOptions {
  // Full recomputation reruns the whole block (Megatron's --recompute-granularity full),
  // not only up to the MLP's output projection as trident's does.
  bool whole_layer_recompute = false;
};

// The predicted step of `config` (its layout resolved for the cluster's world) on `cluster`.
StepPrediction predict_step(const Config& config, const Cluster& cluster, const StepModelOptions& options = {});

struct PlannedLayout {
  Config config;         // resolved: dp, tp, pp, zero, recompute, micro_batch set
  RankMemoryPlan memory; // the busiest rank's, in device memory
  StepPrediction step;
  std::string flags;     // what to add to the config's command line
};

// Every layout of `config` on `cluster` whose busiest rank fits in the GPU's memory
// (95% of it), fastest first (within 0.5%: the lower ZeRO stage, then the less memory).
// UsageError when the cluster or the model cannot work.
std::vector<PlannedLayout> plan_cluster(const Config& config, const Cluster& cluster);

}  // namespace trident
