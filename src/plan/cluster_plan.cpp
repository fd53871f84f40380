#include "plan/cluster_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/footprint.h"
#include "model/parameters.h"
#include "model/transformer_spec.h"
#include "pipeline/schedule.h"
#include "kernels/base/error.h"
#include "train/setup.h"

namespace trident {

namespace {

// Datasheet peaks and memory; NVLink bus bandwidth as nccl-tests' all-reduce reaches it
// on 8 GPUs (A100 NVLink 3: about 230 GB/s; H100/H200 NVLink 4: about 450 GB/s).
// Efficiency: the share of the dense bf16 peak that a training step's compute reaches,
// chosen from the published runs of test_cluster_plan.cpp (Megatron-LM's A100 runs reach
// 44-52% of the peak with their communication and bubble included, torchtitan's FSDP
// runs 51-58%; H100s reach less of their higher peak: torchtitan's Llama 3.1 8B on 8
// H100s at 500 W, 35-39% MFU). Stated, not measured here: no GPU on this machine.
const GpuModel kGpus[] = {
    {"a100", "A100 SXM 80GB", 312.0, 80.0, 2.04, 230.0, 0.60, "efa"},
    {"h100", "H100 SXM 80GB", 989.4, 80.0, 3.35, 450.0, 0.42, "efa"},
    {"h200", "H200 SXM 141GB", 989.4, 140.0, 4.8, 450.0, 0.42, "efa"},
};

constexpr double kUsableMemory = 0.95;  // of the device's memory: the CUDA context, fragmentation

double usable_bytes(const GpuModel& gpu) { return gpu.memory_gib * kUsableMemory * (1024.0 * 1024.0 * 1024.0); }

// The busiest rank of a layout: tp rank 0 (the tp ranks hold equal shares) of the first
// stage (embedding, the most activations in flight) or the last (the head and its logits).
RankMemoryPlan busiest_stage_plan(const Config& config, const kernels::Footprint& k) {
  const int pp = config.parallel.pp;
  RankMemoryPlan first = plan_rank_memory(config, RankCoords(), k, true, 0, /*device_only=*/true);
  if (pp == 1) return first;
  RankMemoryPlan last = plan_rank_memory(config, RankCoords().with(Axis::pp, pp - 1), k, true, 0, /*device_only=*/true);
  return last.device_bytes() > first.device_bytes() ? last : first;
}

// Every key the plan sets, so that the printed command runs this layout whatever the config says.
std::string layout_flags(const Config& c) {
  const ParallelConfig& p = c.parallel;
  std::string flags = "--parallel.dp=" + std::to_string(p.dp) + " --parallel.tp=" + std::to_string(p.tp) +
                      " --parallel.pp=" + std::to_string(p.pp) + " --parallel.zero=" + std::to_string(p.zero) +
                      " --parallel.sequence_parallel=" + (p.sequence_parallel ? "true" : "false") +
                      " --train.recompute=" + name_of(c.train.recompute) + " --train.micro_batch=" +
                      std::to_string(c.train.micro_batch) + " --train.precision=bf16";
  if (p.shard_size != 0) flags += " --parallel.shard_size=0";
  return flags;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; i++)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

const GpuModel& gpu_model(const std::string& name) {
  for (const GpuModel& g : kGpus)
    if (g.name == name) return g;
  throw UsageError("--gpu must be a100, h100 or h200, got '" + name + "'");
}

NetworkModel network_model(const std::string& name, const GpuModel& gpu) {
  NetworkModel n;
  n.name = name;
  if (name == "efa") {
    // p4d: 4 x 100 Gbit/s EFA for 8 A100s; p5 and p5e: 32 x 100 Gbit/s for 8 H100/H200s.
    n.gbps_per_gpu = gpu.name == "a100" ? 50.0 : 400.0;
  } else if (name == "ib") {
    n.gbps_per_gpu = gpu.name == "a100" ? 200.0 : 400.0;  // one HDR / NDR port per GPU (Selene, DGX H100)
  } else {
    char* end = nullptr;
    n.gbps_per_gpu = std::strtod(name.c_str(), &end);
    require(end != name.c_str() && *end == '\0' && n.gbps_per_gpu > 0,
            "--network must be efa, ib or a bandwidth in Gbit/s per GPU (e.g. 400), got '" + name + "'");
    n.name = name + " Gbit/s per GPU";
  }
  return n;
}

StepPrediction predict_step(const Config& config, const Cluster& cluster, const StepModelOptions& options) {
  const TransformerSpec spec = transformer_spec(config.model);
  const ParallelConfig& p = config.parallel;
  const int dp = p.dp, tp = p.tp, pp = p.pp, G = cluster.gpus_per_node, zero = dp > 1 ? p.zero : 0;
  const double T = spec.seq_len, d = spec.d_model, L = spec.n_layer;
  const int micro_batch = config.train.micro_batch;
  const double m = static_cast<double>(config.train.global_batch / dp / micro_batch);  // micro-batches per step
  const GpuModel& gpu = cluster.gpu;
  const double nvlink = gpu.nvlink_gbps * 1e9, network = cluster.network.bus_bytes_per_s();

  // FLOPs per token: the model's (what MFU counts), and what recomputation adds: full
  // reruns each block's forward (2 FLOPs per block parameter and attention's core),
  // selective attention's core only.
  // trident's full recomputation reruns each block up to the MLP's output projection
  // (kept); Megatron's (options.whole_layer_recompute) the whole block.
  const double model_flops = flops_per_token(spec);
  const ParameterLayout whole(spec);
  double block_params = 0;
  for (int l = 0; l < whole.layers(); l++) block_params += static_cast<double>(whole.units()[whole.block_unit(l)].size());
  const double mlp_out = L * static_cast<double>(spec.ffn_dim) * d;
  const double rerun = options.whole_layer_recompute ? block_params : block_params - mlp_out;
  const double attention_core = 4.0 * L * T * spec.attention_width();
  const Recompute recompute = config.train.recompute;
  const double flops = model_flops + (recompute == Recompute::full       ? 2.0 * rerun + attention_core
                                      : recompute == Recompute::selective ? attention_core
                                                                          : 0.0);
  StepPrediction s;
  const double rate = gpu.bf16_tflops * 1e12 * gpu.efficiency;
  const double compute_per_micro_batch = flops * micro_batch * T / (tp * pp) / rate;  // one stage

  // Tensor parallelism: all-reduces (or all-gather + reduce-scatter: the same volume) of
  // the micro-batch's hidden states, in bf16, within the node.
  double tp_per_micro_batch = 0;
  if (tp > 1) {
    const double bytes = micro_batch * T * d * 2;
    const double all_reduce = 2.0 * (tp - 1) / tp * bytes / nvlink;
    const int reruns = recompute != Recompute::full ? 0 : options.whole_layer_recompute ? 2 : 1;
    tp_per_micro_batch = std::ceil(L / pp) * (4 + reruns) * all_reduce;
  }
  const double slot = compute_per_micro_batch + tp_per_micro_batch;
  s.compute_s = m * compute_per_micro_batch;
  s.tp_s = m * tp_per_micro_batch;
  s.bubble_s = (pp - 1) * slot;
  if (pp > 1) {
    const double bytes = micro_batch * T * d * 2 / (p.sequence_parallel ? tp : 1);
    const bool one_node = dp * tp * pp <= G;
    s.pp_s = 2.0 * (pp - 1) * bytes / (one_node ? nvlink : network);
  }

  // Data parallelism over the busiest stage's parameters (this rank's tp share): its
  // blocks, and the embeddings / final norm and head that ZeRO-2/3 keep whole.
  double stage_floats = 0, kept_floats = 0;
  for (int stage : {0, pp - 1}) {
    const ParameterLayout layout(spec, 0, tp, 1, stage_spec(spec.n_layer, stage, pp, p.pp_layers));
    if (static_cast<double>(layout.total_floats()) <= stage_floats) continue;
    stage_floats = static_cast<double>(layout.total_floats());
    kept_floats = 0;
    for (size_t u = 0; u < layout.units().size(); u++)
      if (!layout.unit_is_block()[u]) kept_floats += static_cast<double>(layout.units()[u].size());
  }
  if (dp > 1) {
    const double bw = dp * tp <= G ? nvlink : network;
    const double share = (dp - 1.0) / dp, gradients = stage_floats * 4;
    const double block_floats = stage_floats - kept_floats;
    const double backward = 2.0 / 3.0 * compute_per_micro_batch;  // of one micro-batch
    double overlapped = 0, window = 0, after = 0;
    if (zero == 0) overlapped = 2 * share * gradients / bw, window = backward;  // during the last backward
    if (zero == 1) overlapped = share * gradients / bw, window = backward, after = share * gradients / bw;
    if (zero >= 2) {
      // The blocks' fp32 reduce-scatters every micro-batch, under the backward passes;
      // the kept units' once, after the last backward.
      overlapped = m * share * block_floats * 4 / bw, window = m * backward;
      after = share * kept_floats * 4 / bw;
      if (zero == 2) after += share * gradients / bw;  // the fp32 parameters gathered after the update
      if (zero == 3) {
        // bf16 gathers of each block before its forward and its backward, prefetched under
        // all of the compute; the kept units' once after the update (not hidden).
        overlapped += m * share * 2 * block_floats * 2 / bw;
        window = m * compute_per_micro_batch;
        after += share * kept_floats * 2 / bw;
      }
    }
    s.dp_s = overlapped + after;
    s.dp_exposed_s = std::max(0.0, overlapped - window) + after;
  }
  // AdamW: read parameter, gradient, both moments, write them and the bf16 copy (30 bytes
  // per parameter updated here), at 80% of HBM bandwidth.
  const double updated = zero >= 1 ? stage_floats / dp : stage_floats;
  s.optimizer_s = updated * 30.0 / (gpu.hbm_tbps * 1e12 * 0.8);
  s.step_s = s.compute_s + s.tp_s + s.bubble_s + s.pp_s + s.dp_exposed_s + s.optimizer_s;
  const double tokens = static_cast<double>(config.train.global_batch) * T;
  s.tokens_per_s = tokens / s.step_s;
  s.mfu = model_flops * s.tokens_per_s / (cluster.world() * gpu.bf16_tflops * 1e12);
  return s;
}

std::vector<PlannedLayout> plan_cluster(const Config& config, const Cluster& cluster) {
  require(cluster.nodes >= 1, "--nodes must be at least 1, got " + std::to_string(cluster.nodes));
  require(cluster.gpus_per_node >= 1 && cluster.gpus_per_node <= 64,
          "--gpus_per_node must be 1 to 64, got " + std::to_string(cluster.gpus_per_node));
  const TransformerSpec spec = transformer_spec(config.model);  // the family's own rules
  const int world = cluster.world();
  const std::unique_ptr<kernels::Footprint> footprint = kernels::cuda_footprint(kernels::Precision::bf16);
  std::vector<PlannedLayout> fitting;
  size_t smallest = SIZE_MAX;
  for (int tp : divisors(cluster.gpus_per_node)) {  // within a node (NVLink)
    try {
      check_tensor_parallel(spec, tp);
    } catch (const UsageError&) {
      continue;
    }
    for (int pp : divisors(world / tp)) {
      if (pp > spec.n_layer) break;
      const int dp = world / (tp * pp);
      if (config.train.global_batch % dp != 0) continue;
      const int local = config.train.global_batch / dp;
      for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++)
        for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full})
          for (int micro_batch = 1; micro_batch <= std::min(local, 16); micro_batch *= 2) {
            if (local % micro_batch != 0) continue;
            Config c = config;
            c.train.device = Device::cuda;
            c.train.precision = PrecisionSetting::bf16;
            c.parallel.dp = dp;
            c.parallel.tp = tp;
            c.parallel.pp = pp;
            c.parallel.zero = zero;
            c.parallel.shard_size = 0;
            c.parallel.pp_layers = "";
            c.parallel.sequence_parallel = tp > 1 && spec.seq_len % tp == 0;  // Megatron's default with tp
            c.train.recompute = recompute;
            c.train.micro_batch = micro_batch;
            // train.sbatch always checkpoints: count what a save keeps on the GPU (NCCL's
            // staging of the moments) and on the host.
            if (c.checkpoint.dir.empty()) c.checkpoint.dir = "checkpoints";
            try {
              resolve_for_world(c, world);
            } catch (const UsageError&) {
              continue;
            }
            RankMemoryPlan memory = busiest_stage_plan(c, *footprint);
            smallest = std::min(smallest, memory.device_bytes());
            // Not monotone in the micro-batch (the slots in flight, ZeRO-2/3's accumulation
            // buffers change with it): every one is tried.
            if (static_cast<double>(memory.device_bytes()) > usable_bytes(cluster.gpu)) continue;
            fitting.push_back({c, std::move(memory), predict_step(c, cluster), layout_flags(c)});
          }
    }
  }
  require(smallest != SIZE_MAX, "no layout of " + std::to_string(world) + " GPUs works for this model and a global "
                                "batch of " + std::to_string(config.train.global_batch) +
                                " (dp must divide train.global_batch, tp model.n_head)");
  if (fitting.empty()) {
    char what[256];
    std::snprintf(what, sizeof what, "%.1f GiB per GPU in its leanest layout; a %s has %.1f GiB (%.0f%% usable)",
                  gib(static_cast<double>(smallest)), cluster.gpu.description.c_str(), cluster.gpu.memory_gib,
                  100 * kUsableMemory);
    throw UsageError("the model does not fit on " + std::to_string(cluster.nodes) + " node(s) x " +
                     std::to_string(cluster.gpus_per_node) + " GPUs under any layout: it needs " + what +
                     "; more nodes are needed");
  }
  // Fastest first; within 0.5% of each other (the model cannot tell them apart) the
  // simpler layout first: the lower ZeRO stage, then the less memory.
  const auto speed_class = [](const PlannedLayout& l) { return std::floor(std::log(l.step.tokens_per_s) / std::log(1.005)); };
  std::stable_sort(fitting.begin(), fitting.end(), [&](const PlannedLayout& a, const PlannedLayout& b) {
    if (speed_class(a) != speed_class(b)) return speed_class(a) > speed_class(b);
    if (a.config.parallel.zero != b.config.parallel.zero) return a.config.parallel.zero < b.config.parallel.zero;
    return a.memory.device_bytes() < b.memory.device_bytes();
  });
  return fitting;
}

}  // namespace trident
