#include "cli/plan_command.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <sstream>

#include "config/config.h"
#include "model/transformer_spec.h"
#include "kernels/base/error.h"
#include "plan/cluster_plan.h"

namespace po = boost::program_options;

namespace trident {

namespace {

constexpr const char* kPlanUsage =
    "usage: trident plan --config FILE.ini --nodes N --gpus_per_node G --gpu a100|h100|h200\n"
    "                    [--network efa|ib|GBPS] [--top K] [--section.key=value ...]\n"
    "  Every layout (dp, tp, cp, ep, pp, pipeline schedule, ZeRO stage, recompute, micro-batch) of the config's model and\n"
    "  global batch that fits N nodes of G GPUs: the busiest GPU's memory from trident's memory\n"
    "  plan and a predicted step time, the K fastest first, and the sbatch line of the best.\n"
    "  A layout key set in the config or by a flag (parallel.dp, tp, cp, ep, pp, schedule, vpp,\n"
    "  zero, sequence_parallel, train.recompute, micro_batch) pins it: only layouts with its value.\n"
    "  --network: between nodes; efa (the GPU's AWS instance: p4d, p5), ib (one HDR/NDR port\n"
    "  per GPU), or Gbit/s per GPU.\n";

std::string config_path(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == "--config" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) return args[i].substr(9);
  }
  return "";
}

}  // namespace

int run_plan_command(const std::vector<std::string>& args) {
  int nodes = 0, gpus_per_node = 8, top = 5;
  std::string gpu, network;
  bool help = false;
  po::options_description own("Options of 'trident plan'");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")(
      "nodes", po::value(&nodes), "nodes of the cluster")(
      "gpus_per_node", po::value(&gpus_per_node)->default_value(8), "GPUs per node")(
      "gpu", po::value(&gpu), "a100, h100 or h200")(
      "network", po::value(&network), "efa (default), ib, or Gbit/s per GPU")(
      "top", po::value(&top)->default_value(5), "layouts to show");
  const std::vector<std::string> rest = take_command_options(args, own, kPlanUsage);
  if (help) {
    std::ostringstream text;
    text << kPlanUsage << "\n" << own;
    std::printf("%s", text.str().c_str());
    return 0;
  }
  require(nodes > 0, std::string("--nodes is required (at least 1)\n") + kPlanUsage);
  require(!gpu.empty(), std::string("--gpu is required\n") + kPlanUsage);
  require(top >= 1, "--top must be at least 1, got " + std::to_string(top));
  const CommandLine cl = parse_command_line("plan", rest);
  Cluster cluster;
  cluster.nodes = nodes;
  cluster.gpus_per_node = gpus_per_node;
  cluster.gpu = gpu_model(gpu);
  cluster.network = network_model(network.empty() ? cluster.gpu.default_network : network, cluster.gpu);
  const LayoutPins pins = layout_pins(cl.given, cl.config);
  const std::vector<PlannedLayout> layouts = plan_cluster(cl.config, cluster, pins);

  const TransformerSpec spec = transformer_spec(cl.config.model);
  std::printf("plan: %s (%s), global batch %d x %d tokens, on %d node(s) x %d %s "
              "(%.0f TFLOP/s bf16 dense, GEMMs up to %.0f%% of it, NVLink %.0f GB/s, network %s: %.0f GB/s per GPU)\n",
              spec.describe().c_str(), parameter_summary(spec).c_str(), cl.config.train.global_batch, spec.seq_len, nodes,
              gpus_per_node, cluster.gpu.description.c_str(), cluster.gpu.bf16_tflops, 100 * cluster.gpu.gemm_efficiency,
              cluster.gpu.nvlink_gbps, cluster.network.name.c_str(), cluster.network.bus_bytes_per_s() / 1e9);
  if (pins.any()) std::printf("pinned (set in the config or by flags): %s\n", pins.describe(cl.config).c_str());
  std::printf("%zu layouts fit (busiest GPU within 95%% of %.0f GiB); the %d fastest:\n", layouts.size(),
              cluster.gpu.memory_gib, std::min<int>(top, static_cast<int>(layouts.size())));
  const bool experts = spec.n_experts > 0;  // a mixture of experts: the ep column and its exchanges
  std::printf("%3s %4s %3s %3s %3s%s %-11s %3s %4s %-9s %3s %8s %8s %10s %6s  %s\n", "#", "dp", "tp", "cp", "pp",
              experts ? "  ep" : "", "schedule", "vpp", "zero", "recompute", "mb", "GiB/GPU", "step s", "tokens/s", "MFU",
              experts ? "step: compute + tp + all-to-all + bubble + pp + dp exposed (of dp) + optimizer, s"
                      : "step: compute + tp + bubble + pp + dp exposed (of dp) + optimizer, s");
  for (int i = 0; i < top && i < static_cast<int>(layouts.size()); i++) {
    const PlannedLayout& l = layouts[i];
    const ParallelConfig& p = l.config.parallel;
    const StepPrediction& s = l.step;
    char ep[8] = "", exchange[16] = "", recompute[16];
    // Full recomputation of some layers: "full:5", 5 layers of each chunk.
    if (l.config.train.recompute == Recompute::full && l.config.train.recompute_layers > 0)
      std::snprintf(recompute, sizeof recompute, "full:%d", l.config.train.recompute_layers);
    else
      std::snprintf(recompute, sizeof recompute, "%s", name_of(l.config.train.recompute));
    if (experts) {
      std::snprintf(ep, sizeof ep, " %3d", p.ep);
      std::snprintf(exchange, sizeof exchange, " + %.3f", s.ep_s);
    }
    std::printf("%3d %4d %3d %3d %3d%s %-11s %3d %4d %-9s %3d %8.1f %8.3f %10.0f %5.1f%%  %.3f + %.3f%s + %.3f + %.3f + %.3f (%.3f) + %.3f\n",
                i + 1, p.dp, p.tp, p.cp, p.pp, ep, name_of(p.schedule), p.vpp, p.zero, recompute,
                l.config.train.micro_batch, gib(static_cast<double>(l.memory.device_bytes())), s.step_s, s.tokens_per_s,
                100 * s.mfu, s.compute_s, s.tp_s, exchange, s.bubble_s, s.pp_s, s.dp_exposed_s, s.dp_s, s.optimizer_s);
  }
  const PlannedLayout& best = layouts.front();
  std::printf("memory of the best layout's busiest GPU: %s\n", best.memory.describe().c_str());
  const std::string path = config_path(rest);
  std::printf("best: sbatch --nodes=%d --ntasks-per-node=%d --gpus-per-node=%d slurm/train.sbatch %s --device=cuda %s\n",
              nodes, gpus_per_node, gpus_per_node, path.empty() ? "CONFIG.ini" : path.c_str(), best.flags.c_str());
  return 0;
}

}  // namespace trident
