#include "plan/cluster_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/footprint.h"
#include "model/parameters.h"
#include "model/transformer_spec.h"
#include "pipeline/schedule.h"
#include "plan/layer_time.h"
#include "plan/schedule_time.h"
#include "kernels/base/error.h"
#include "optim/optimizer.h"
#include "parallel/param_grad_store.h"
#include "plan/run_layout.h"

namespace trident {

namespace {

constexpr double kUsableMemory = 0.95;  // of the device's memory: the CUDA context, fragmentation
constexpr int kLongSequence = 16384;    // tokens from which context parallelism is tried

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
                      " --parallel.cp=" + std::to_string(p.cp) + " --parallel.ep=" + std::to_string(p.ep) +
                      " --parallel.pp=" + std::to_string(p.pp) + " --parallel.schedule=" + name_of(p.schedule) +
                      " --parallel.vpp=" + std::to_string(p.vpp) + " --parallel.zero=" + std::to_string(p.zero) +
                      " --parallel.sequence_parallel=" + (p.sequence_parallel ? "true" : "false") +
                      " --train.recompute=" + name_of(c.train.recompute) +
                      " --train.recompute_layers=" + std::to_string(c.train.recompute_layers) +
                      (c.train.recompute_layers > 0
                           ? " --train.recompute_method=" + std::string(name_of(c.train.recompute_method))
                           : std::string()) +
                      " --train.micro_batch=" +
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

// The schedules tried on `pp` stages: 1F1B, interleaved with 2 and 4 chunks per rank, zero
// bubble (ZB-H1); one stage has no schedule to choose. GPipe is left out (1F1B's bubble
// with every micro-batch's activations held: it never wins) unless pinned.
std::vector<std::pair<Schedule, int>> schedules(int pp, const Config& config, const LayoutPins& pins) {
  std::vector<std::pair<Schedule, int>> tried;
  if (pp == 1) tried = {{Schedule::one_f_one_b, 1}};
  else tried = {{Schedule::one_f_one_b, 1}, {Schedule::interleaved, 2}, {Schedule::interleaved, 4}, {Schedule::zb1, 1}};
  if (pins.pinned("parallel.schedule")) {
    const Schedule s = config.parallel.schedule;
    tried = s == Schedule::interleaved ? std::vector<std::pair<Schedule, int>>{{s, 2}, {s, 4}}
                                       : std::vector<std::pair<Schedule, int>>{{s, 1}};
  }
  if (pins.pinned("parallel.vpp")) {
    // vpp > 1 is interleaved's (the config says so); vpp = 1 keeps every other schedule.
    std::vector<std::pair<Schedule, int>> kept;
    for (const auto& [s, v] : tried)
      if ((config.parallel.vpp > 1) == (s == Schedule::interleaved) &&
          std::find(kept.begin(), kept.end(), std::pair{s, config.parallel.vpp}) == kept.end())
        kept.push_back({s, config.parallel.vpp});
    tried = kept;
  }
  return tried;
}

}  // namespace

StepPrediction predict_step(const Config& config, const Cluster& cluster, const StepModelOptions& options) {
  const TransformerSpec spec = transformer_spec(config.model);
  const ParallelConfig& p = config.parallel;
  const int dp = p.dp, tp = p.tp, pp = p.pp, cp = p.cp, G = cluster.gpus_per_node;
  const int replicas = dp * cp;  // the ranks that hold the same parameters (gradients, ZeRO)
  const int zero = replicas > 1 ? p.zero : 0;
  // A rank's tokens of each sequence: context parallelism splits them over cp ranks.
  const double T = static_cast<double>(spec.seq_len) / cp, d = spec.d_model;
  TransformerSpec local = spec;
  local.seq_len = spec.seq_len / cp;
  const int micro_batch = config.train.micro_batch;
  const double m = static_cast<double>(config.train.global_batch / dp / micro_batch);  // micro-batches per step
  const GpuModel& gpu = cluster.gpu;
  const double nvlink = gpu.nvlink_gbps * 1e9, network = cluster.network.bus_bytes_per_s();
  const bool sequence_parallel = p.sequence_parallel && tp > 1;

  // One layer's passes, and what recomputation reruns before its backward: trident's full
  // recompute the layer up to the MLP's output projection (kept), Megatron's
  // (options.whole_layer_recompute) the whole layer; selective attention's core.
  LayerTimes layer = layer_times(local, micro_batch, tp, sequence_parallel, gpu, options);
  // Under context parallelism a rank's queries meet all T keys, not only its T / cp: its
  // attention is 1/cp of the whole's (the chunks balance it), cp times a T/cp sequence's.
  layer.attention_forward *= cp;
  layer.attention_backward *= cp;
  // The ring (model/context_parallel.h): per layer, cp - 1 key/value blocks forward, 2 cp - 1
  // blocks (the keys and values again, and their gradients) backward, each sent while the
  // previous block's attention runs: only what that attention cannot hide is counted.
  double ring_forward = 0, ring_backward = 0;
  if (cp > 1) {
    const double kv = static_cast<double>(spec.n_kv_head) * spec.head_dim / spec.kv_shards(tp);
    const double block = micro_batch * T * 2 * kv * 2;  // bf16 k and v of the rank's tokens
    const double bw = tp * cp <= G ? nvlink : network;
    ring_forward = std::max(0.0, (cp - 1) * block / bw - layer.attention_forward);
    ring_backward = std::max(0.0, (2 * cp - 1) * block / bw - layer.attention_backward);
  }
  const Recompute recompute = config.train.recompute;
  const double rerun = recompute == Recompute::full
                           ? layer.forward() - (options.whole_layer_recompute ? 0.0 : layer.mlp_out_forward)
                       : recompute == Recompute::selective ? layer.attention_forward
                                                            : 0.0;
  // Tensor parallelism: all-reduces (or all-gather + reduce-scatter: the same volume) of
  // the micro-batch's hidden states, in bf16, within the node; 2 in forward, 2 in
  // backward, and the rerun's.
  double all_reduce = 0;
  if (tp > 1) all_reduce = 2.0 * (tp - 1) / tp * (micro_batch * T * d * 2) / nvlink;
  const int reruns = recompute != Recompute::full ? 0 : options.whole_layer_recompute ? 2 : 1;
  // Expert parallelism: per MoE layer and micro-batch the routed rows (the micro-batch's
  // tokens x K, bf16, all rows under sequence parallelism) go to their experts' ranks and
  // come back, forward and backward, and again in a full recompute's rerun; (ep - 1) / ep
  // of them leave the rank. An ep group is consecutive data-parallel ranks, tp apart: the
  // members on this node over NVLink, the others over the network.
  double exchange = 0;
  if (p.ep > 1 && spec.n_experts > 0) {
    const double bytes = micro_batch * T * spec.experts_per_token * d * 2;
    const int on_node = std::min(p.ep, std::max(1, G / tp));
    exchange = bytes / p.ep * ((on_node - 1) / nvlink + (p.ep - on_node) / network);
  }
  const int exchanges = 2, rerun_exchanges = recompute == Recompute::full ? 2 : 0;

  // The busiest stage: the most layers (the first ones of a balanced split) or the head (the last).
  const std::vector<int> layers = stage_layer_counts(spec.n_layer, pp, p.pp_layers);
  const PassTimes head = head_times(local, micro_batch, tp, gpu);
  PassTimes compute, busiest;
  double tp_per_micro_batch = 0, ep_per_micro_batch = 0;
  for (int stage : {0, pp - 1}) {
    const double n = layers[stage], with_head = stage == pp - 1 ? 1.0 : 0.0;
    // The layers whose backward reruns: all under recompute, but train.recompute_layers of each chunk.
    const int chunk = layers[stage] / p.vpp, partial = config.train.recompute_layers;
    const double rerun_layers = recompute == Recompute::none ? 0.0
                                : recompute == Recompute::full && partial > 0 ? p.vpp * std::min(partial, chunk)
                                                                             : n;
    PassTimes c{n * layer.forward() + with_head * head.forward,
                n * layer.input_grad() + rerun_layers * rerun + with_head * head.input_gradient,
                n * layer.gemm_weight_grad + with_head * head.weight_gradient};
    const double tp_forward = n * (2 * all_reduce + ring_forward),
                 tp_backward = n * (2 * all_reduce + ring_backward) + rerun_layers * (reruns * all_reduce + ring_forward);
    const double ep_forward = n * exchanges * exchange,
                 ep_backward = (n * exchanges + rerun_layers * rerun_exchanges) * exchange;
    const PassTimes total{c.forward + tp_forward + ep_forward, c.input_gradient + tp_backward + ep_backward,
                          c.weight_gradient};
    if (total.total() <= busiest.total()) continue;
    busiest = total;
    compute = c;
    tp_per_micro_batch = tp_forward + tp_backward;
    ep_per_micro_batch = ep_forward + ep_backward;
  }
  StepPrediction s;
  s.forward_s = busiest.forward;
  s.input_grad_s = busiest.input_gradient;
  s.weight_grad_s = busiest.weight_gradient;
  s.compute_s = m * compute.total();
  s.tp_s = m * tp_per_micro_batch;
  s.ep_s = m * ep_per_micro_batch;
  s.bubble_s = pipeline_bubble(p.schedule, pp, p.vpp, busiest);
  if (pp > 1) {
    const double bytes = micro_batch * T * d * 2 / (sequence_parallel ? tp : 1);
    const bool one_node = dp * tp * cp * pp <= G;
    s.pp_s = critical_path_transfers(p.schedule, pp, p.vpp) * bytes / (one_node ? nvlink : network);
  }

  // Data parallelism over the busiest stage's parameters (this rank's tp share): its
  // blocks, and the units ZeRO-2/3 keep whole: the embeddings / final norm and head
  // (ZeRO-3 gathers them around their use like the blocks where they fit a block's window).
  // Under expert parallelism the stage holds E / ep experts, whose gradients are summed
  // over the replicas / ep ranks holding the same ones.
  double stage_floats = 0, kept_floats = 0, expert_floats = 0;
  // ZeRO-3's windowed ends: gathered once per micro-batch (the head's stays for its
  // backward; the embedding's backward reads none), reduced once; a tied table's (counted
  // once in end_floats) gathered and reduced at each end.
  double end_floats = 0, tied_floats = 0;
  for (int stage : {0, pp - 1}) {
    StageSpec held = stage_spec(spec.n_layer, stage, pp, p.pp_layers);
    held.ep = spec.n_experts > 0 ? p.ep : 1;
    const ParameterLayout layout(spec, 0, tp, 1, held);
    if (static_cast<double>(layout.total_floats()) <= stage_floats) continue;
    stage_floats = static_cast<double>(layout.total_floats());
    expert_floats = 0;
    for (const FlatRange& r : layout.region_ranges()) expert_floats += static_cast<double>(r.size());  // the experts
    kept_floats = 0;
    const bool defers = p.schedule == Schedule::zb1 && recompute == Recompute::none;
    const std::vector<bool> windowed =
        ParamGradStore::windowed_units(layout, zero >= 2 ? static_cast<ZeroStage>(zero) : ZeroStage::gradients, defers);
    end_floats = tied_floats = 0;
    for (size_t u = 0; u < layout.units().size(); u++) {
      const double floats = static_cast<double>(layout.units()[u].size());
      if (!windowed[u]) kept_floats += floats;
      else if (!layout.unit_is_block()[u]) end_floats += floats;
    }
    if (layout.head_reads_embedding_unit() && windowed[layout.embedding_unit()])
      tied_floats = static_cast<double>(layout.units()[layout.embedding_unit()].size());
  }
  if (replicas > 1) {
    // Across nodes NCCL runs one ring per network interface: a dp group with k members on
    // each node moves its data over k GPUs' links at once (nccl-tests' bus bandwidth over
    // nodes is about the node's line rate when all of its GPUs take part), up to NVLink's.
    // Under context parallelism the group is dp x cp.
    const int members_per_node = std::max(1, G / (tp * pp));
    const double bw = replicas * tp * pp <= G ? nvlink : std::min(nvlink, members_per_node * network);
    const double share = (replicas - 1.0) / replicas;
    const int expert_replicas = replicas / std::max(1, p.ep);
    // The experts' share of the traffic, as floats reduced over all the replicas.
    const double experts_as_shared = expert_floats * ((expert_replicas - 1.0) / expert_replicas) / share;
    const double gradients = (stage_floats - expert_floats + experts_as_shared) * 4;
    // The blocks' floats as above: the experts' counted as their smaller group moves them.
    const double block_floats = stage_floats - kept_floats - expert_floats + experts_as_shared;
    const double backward = compute.input_gradient + compute.weight_gradient;  // of one micro-batch
    double overlapped = 0, window = 0, after = 0;
    if (zero == 0) overlapped = 2 * share * gradients / bw, window = backward;  // during the last backward
    if (zero == 1) overlapped = share * gradients / bw, window = backward, after = share * gradients / bw;
    if (zero >= 2) {
      // The blocks' fp32 reduce-scatters every micro-batch, under the backward passes;
      // the kept units' once, after the last backward.
      overlapped = m * share * (block_floats + tied_floats) * 4 / bw, window = m * backward;
      after = share * kept_floats * 4 / bw;
      if (zero == 2) after += share * gradients / bw;  // the fp32 parameters gathered after the update
      if (zero == 3) {
        // bf16 gathers of each block before its forward and its backward (of a windowed end
        // as said above), prefetched under all of the compute; the kept units' once after
        // the update (not hidden).
        overlapped += m * share * (2 * (block_floats - end_floats) + end_floats + tied_floats) * 2 / bw;
        window = m * compute.total();
        after += share * kept_floats * 2 / bw;
      }
    }
    s.dp_s = overlapped + after;
    s.dp_exposed_s = std::max(0.0, overlapped - window) + after;
  }
  // The optimizer's update of the parameters updated here (AdamW: read parameter,
  // gradient, both moments, write them and the bf16 copy, 30 bytes each), at 80% of HBM
  // bandwidth.
  const double updated = zero >= 1 ? (stage_floats - expert_floats) / replicas + expert_floats * p.ep / replicas
                                   : stage_floats;
  s.optimizer_s = updated * optimizer_kind(config.train.optimizer).update_bytes_per_parameter /
                  (gpu.hbm_tbps * 1e12 * 0.8);
  s.step_s = s.compute_s + s.tp_s + s.ep_s + s.bubble_s + s.pp_s + s.dp_exposed_s + s.optimizer_s;
  const double tokens = static_cast<double>(config.train.global_batch) * spec.seq_len;
  s.tokens_per_s = tokens / s.step_s;
  s.mfu = flops_per_token(spec) * s.tokens_per_s / (cluster.world() * gpu.bf16_tflops * 1e12);
  return s;
}

std::vector<PlannedLayout> plan_cluster(const Config& config, const Cluster& cluster, const LayoutPins& pins) {
  require(cluster.nodes >= 1, "--nodes must be at least 1, got " + std::to_string(cluster.nodes));
  require(cluster.gpus_per_node >= 1 && cluster.gpus_per_node <= 64,
          "--gpus_per_node must be 1 to 64, got " + std::to_string(cluster.gpus_per_node));
  const TransformerSpec spec = transformer_spec(config.model);  // the family's own rules
  const int world = cluster.world(), G = cluster.gpus_per_node;
  const std::unique_ptr<kernels::Footprint> footprint = kernels::cuda_footprint(kernels::Precision::bf16);
  // A pinned key keeps the config's value; the others range over what the planner tries.
  const auto values = [&](const char* key, std::vector<int> free, int set) {
    return pins.pinned(key) ? std::vector<int>{set} : free;
  };
  std::vector<PlannedLayout> fitting;
  size_t smallest = SIZE_MAX;
  std::string leanest;      // the flags of the layout with the least memory
  std::string broken_rule;  // the first rule a pinned layout broke, as a run would say it
  const auto refuse = [&](const std::string& why) {
    if (broken_rule.empty()) broken_rule = why;
  };
  // Every layout of one (tp, cp, pp) grid: its dp, schedules, ZeRO stages, recompute and
  // micro-batches.
  const auto try_grid = [&](int tp, int cp, int pp) {
    if (world % (tp * cp * pp) != 0) {
      const std::string axes = cp > 1 ? "parallel.tp x parallel.cp x parallel.pp (" + std::to_string(tp) + " x " +
                                            std::to_string(cp) + " x " + std::to_string(pp)
                                      : "parallel.tp x parallel.pp (" + std::to_string(tp) + " x " + std::to_string(pp);
      refuse(axes + ") must divide the cluster's " + std::to_string(world) + " GPUs");
      return;
    }
    const int dp = world / (tp * cp * pp);
    if (pins.pinned("parallel.dp") && dp != config.parallel.dp) {
      refuse("parallel.dp=" + std::to_string(config.parallel.dp) + " x tp " + std::to_string(tp) + " x cp " +
             std::to_string(cp) + " x pp " + std::to_string(pp) + " needs " +
             std::to_string(config.parallel.dp * tp * cp * pp) + " GPUs; the cluster has " + std::to_string(world));
      return;
    }
    if (config.train.global_batch % dp != 0) {
      refuse("train.global_batch (" + std::to_string(config.train.global_batch) + ") must be a multiple of dp (" +
             std::to_string(dp) + ")");
      return;
    }
    const int local = config.train.global_batch / dp;
    std::vector<int> micro_batches;
    for (int micro_batch = 1; micro_batch <= std::min(local, 16); micro_batch *= 2) micro_batches.push_back(micro_batch);
    // A mixture of experts: its experts over ep of the dp x cp ranks (ep dividing both).
    std::vector<int> expert_groups = {1};
    for (int ep = 2; spec.n_experts > 0 && ep <= dp * cp; ep++)
      if ((dp * cp) % ep == 0 && spec.n_experts % ep == 0) expert_groups.push_back(ep);
    for (int ep : values("parallel.ep", expert_groups, config.parallel.ep))
    for (const auto& [schedule, vpp] : schedules(pp, config, pins))
      for (int zero : values("parallel.zero", dp * cp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0}, config.parallel.zero))
        for (Recompute recompute : pins.pinned("train.recompute") ? std::vector<Recompute>{config.train.recompute}
                                                                   : std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full})
          for (int micro_batch : values("train.micro_batch", micro_batches, config.train.micro_batch)) {
            Config c = config;
            c.train.device = Device::cuda;
            c.train.precision = PrecisionSetting::bf16;
            c.parallel.dp = dp;
            c.parallel.tp = tp;
            c.parallel.cp = cp;
            c.parallel.ep = ep;
            c.parallel.pp = pp;
            c.parallel.schedule = schedule;
            c.parallel.vpp = vpp;
            c.parallel.zero = zero;
            c.parallel.shard_size = 0;
            c.parallel.pp_layers = "";
            if (!pins.pinned("parallel.sequence_parallel"))
              c.parallel.sequence_parallel = tp > 1 && (spec.seq_len / cp) % tp == 0;  // Megatron's default with tp
            c.train.recompute = recompute;
            if (!pins.pinned("train.recompute_layers")) c.train.recompute_layers = 0;  // chosen below
            c.train.micro_batch = micro_batch;
            // train.sbatch always checkpoints: count what a save keeps on the GPU (NCCL's
            // staging of the moments) and on the host.
            if (c.checkpoint.dir.empty()) c.checkpoint.dir = "checkpoints";
            try {
              c.validate();
              resolve_for_world(c, world);
              // The stage's chunks share its layers equally (as the run's stage split checks).
              stage_layer_counts(c.model.n_layer, c.parallel.pp, c.parallel.pp_layers, c.parallel.vpp);
            } catch (const UsageError& e) {
              refuse(e.what());
              continue;
            }
            RankMemoryPlan memory = busiest_stage_plan(c, *footprint);
            if (memory.device_bytes() < smallest) {
              smallest = memory.device_bytes();
              leanest = layout_flags(c) + ": " + memory.describe();
            }
            // Not monotone in the micro-batch (the slots in flight, ZeRO-2/3's accumulation
            // buffers change with it): every one is tried.
            const auto fits = [&](const RankMemoryPlan& m) {
              return static_cast<double>(m.device_bytes()) <= usable_bytes(cluster.gpu);
            };
            if (!fits(memory)) continue;
            // Full recomputation that fits: the fewest layers per chunk that still fit, as
            // Megatron's --recompute-num-layers (the memory falls as N grows: bisection).
            if (recompute == Recompute::full && c.train.recompute_layers == 0 &&
                !pins.pinned("train.recompute_layers")) {
              const std::vector<int> counts =
                  stage_layer_counts(c.model.n_layer, c.parallel.pp, c.parallel.pp_layers, c.parallel.vpp);
              const int all = *std::max_element(counts.begin(), counts.end()) / c.parallel.vpp;
              int lo = 1, hi = all;
              while (lo < hi) {
                Config partial = c;
                partial.train.recompute_layers = (lo + hi) / 2;
                if (fits(busiest_stage_plan(partial, *footprint))) hi = partial.train.recompute_layers;
                else lo = partial.train.recompute_layers + 1;
              }
              if (hi < all) {
                c.train.recompute_layers = hi;
                memory = busiest_stage_plan(c, *footprint);
              }
            }
            fitting.push_back({c, std::move(memory), predict_step(c, cluster), layout_flags(c)});
          }
  };
  for (int tp : values("parallel.tp", divisors(G), config.parallel.tp)) {
    if (G % tp != 0) {
      refuse("parallel.tp (" + std::to_string(tp) + ") must divide the GPUs of a node (" + std::to_string(G) +
             "): trident plan keeps tensor parallelism within a node's NVLink");
      continue;
    }
    try {
      check_tensor_parallel(spec, tp);
    } catch (const UsageError& e) {
      refuse(e.what());
      continue;
    }
    // Context parallelism for long sequences (16K tokens and more, where Megatron's and
    // torchtitan's recipes turn it on): powers of two up to 16 that cut the sequence into
    // 2 cp chunks (Llama 3 ran cp 16 at 128K tokens).
    std::vector<int> context = {1};
    for (int cp = 2; cp <= 16 && spec.seq_len >= kLongSequence && (world / tp) % cp == 0; cp *= 2)
      if (spec.seq_len % (2 * cp) == 0) context.push_back(cp);
    for (int cp : values("parallel.cp", context, config.parallel.cp)) {
      std::vector<int> stages;
      for (int pp : divisors(world / tp))
        if (pp <= spec.n_layer && (world / tp) % (pp * cp) == 0) stages.push_back(pp);
      for (int pp : values("parallel.pp", stages, config.parallel.pp)) try_grid(tp, cp, pp);
    }
  }
  const std::string on = std::to_string(cluster.nodes) + " node(s) x " + std::to_string(G) + " GPUs";
  if (smallest == SIZE_MAX) {
    require(!pins.any(), "no layout with " + pins.describe(config) + " works on " + on + ": " + broken_rule);
    throw UsageError("no layout of " + std::to_string(world) + " GPUs works for this model and a global batch of " +
                     std::to_string(config.train.global_batch) + " (dp must divide train.global_batch, tp model.n_head)");
  }
  if (fitting.empty()) {
    char needs[64], has[160];
    std::snprintf(needs, sizeof needs, "%.1f GiB per GPU", gib(static_cast<double>(smallest)));
    std::snprintf(has, sizeof has, "a %s has %.1f GiB (%.0f%% usable)", cluster.gpu.description.c_str(),
                  cluster.gpu.memory_gib, 100 * kUsableMemory);
    if (pins.any())
      throw UsageError("the layouts with " + pins.describe(config) + " do not fit on " + on + ": the leanest needs " +
                       needs + "; " + has + ". It is " + leanest + ". Unpin one of these keys or add nodes");
    throw UsageError("the model does not fit on " + on + " under any layout: it needs " + needs +
                     " in its leanest layout; " + has + "; more nodes are needed");
  }
  // Fastest first; within 0.5% of each other (the model cannot tell them apart) the
  // simpler layout first: the lower ZeRO stage, the simpler schedule, then the less memory.
  const auto speed_class = [](const PlannedLayout& l) { return std::floor(std::log(l.step.tokens_per_s) / std::log(1.005)); };
  const auto schedule_rank = [](const ParallelConfig& p) {
    return p.schedule == Schedule::one_f_one_b ? 0 : p.schedule == Schedule::zb1 ? 1 : 1 + p.vpp;
  };
  std::stable_sort(fitting.begin(), fitting.end(), [&](const PlannedLayout& a, const PlannedLayout& b) {
    if (speed_class(a) != speed_class(b)) return speed_class(a) > speed_class(b);
    if (a.config.parallel.zero != b.config.parallel.zero) return a.config.parallel.zero < b.config.parallel.zero;
    if (schedule_rank(a.config.parallel) != schedule_rank(b.config.parallel))
      return schedule_rank(a.config.parallel) < schedule_rank(b.config.parallel);
    return a.memory.device_bytes() < b.memory.device_bytes();
  });
  return fitting;
}

}  // namespace trident
