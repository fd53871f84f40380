// `trident plan`'s step-time model against published training runs, each at its own
// model, batch, layout and cluster: the predicted tokens/s per GPU within 25% of what was
// reported. The runs (benchmarks/RESULTS.md lists them with the predictions):
//   Megatron-LM's weak-scaling table (README; Narayanan et al. 2021, Table 1): GPT models
//     on Selene (DGX A100 80GB, 8 x 200 Gbit/s InfiniBand per node), s = 2048, V = 51200,
//     full recomputation, reported in teraFLOP/s per GPU by their formula
//     96 B s l h^2 (1 + s/6h + V/16lh) per iteration (recomputation counted).
//   llm.c's GPT-2 124M run (discussion #481): 10B tokens in about 90 minutes on 8 A100s.
//   torchtitan's docs/performance.md: Llama 3 8B and 70B with FSDP2 (ZeRO-3) on 64 A100s,
//     local batch 1, T = 8192; Llama 3.1 8B with FSDP on 8 H100s (500 W), local batch 2.
// Also: the layouts plan_cluster() returns fit, come fastest first, and what cannot fit is
// one clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "kernels/base/error.h"
#include "plan/cluster_plan.h"
#include "cli_helpers.h"

namespace trident {
namespace {

struct PublishedRun {
  const char* source;
  ModelConfig model;
  int gpus, tp, pp, zero, global_batch, micro_batch;
  const char* recompute;
  const char* gpu;
  const char* network;
  double tokens_per_s_per_gpu;  // reported (or converted from the reported FLOP/s)
  bool whole_layer_recompute = false;  // Megatron's full recomputation reruns the whole layer
};

ModelConfig megatron_gpt(int layers, int hidden, int heads) {
  ModelConfig m;
  m.family = Family::gpt2;
  m.n_layer = layers;
  m.d_model = hidden;
  m.n_head = heads;
  m.seq_len = 2048;
  m.vocab_size = 51200;
  return m;
}

// Tokens/s per GPU from Megatron's reported teraFLOP/s per GPU (their FLOP count).
double megatron_tokens(double tflops, const ModelConfig& m) {
  const double l = m.n_layer, h = m.d_model, s = m.seq_len, V = m.vocab_size;
  return tflops * 1e12 / (96.0 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)));
}

ModelConfig llama3(int layers, int hidden, int heads, int ffn) {
  ModelConfig m;
  m.family = Family::llama;
  m.n_layer = layers;
  m.d_model = hidden;
  m.n_head = heads;
  m.n_kv_head = 8;
  m.ffn_dim = ffn;
  m.seq_len = 8192;
  m.vocab_size = 128256;
  return m;
}

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> runs;
  const auto megatron = [&](const char* name, int layers, int hidden, int heads, int tp, int pp, int gpus, int batch,
                            double tflops) {
    const ModelConfig m = megatron_gpt(layers, hidden, heads);
    runs.push_back({name, m, gpus, tp, pp, 0, batch, 1, "full", "a100", "ib", megatron_tokens(tflops, m), true});
  };
  megatron("Megatron-LM 1.7B, 32 A100", 24, 2304, 24, 1, 1, 32, 512, 137);
  megatron("Megatron-LM 18B, 256 A100", 40, 6144, 48, 8, 1, 256, 1024, 135);
  megatron("Megatron-LM 145B, 1536 A100", 80, 12288, 96, 8, 8, 1536, 2304, 148);
  megatron("Megatron-LM 1T, 3072 A100", 128, 25600, 160, 8, 64, 3072, 3072, 163);
  // llm.c's GPT-2 124M reproduction (its discussion #481): 10B tokens in about 90 minutes on
  // one node of 8 A100 80GB SXM, batch 524288 tokens as 8 x 64 x 1024, ZeRO-1, no recompute.
  ModelConfig gpt2_124m = megatron_gpt(12, 768, 12);
  gpt2_124m.seq_len = 1024;
  gpt2_124m.vocab_size = 50257;
  runs.push_back({"llm.c GPT-2 124M, 8 A100", gpt2_124m, 8, 1, 1, 1, 512, 64, "none", "a100", "efa", 10e9 / 5400 / 8});
  runs.push_back({"torchtitan Llama 3 8B FSDP, 64 A100", llama3(32, 4096, 32, 14336), 64, 1, 1, 3, 64, 1,
                  "selective", "a100", "ib", 2973});
  runs.push_back({"torchtitan Llama 3 70B FSDP, 64 A100", llama3(80, 8192, 64, 28672), 64, 1, 1, 3, 64, 1, "full",
                  "a100", "ib", 331});
  runs.push_back({"torchtitan Llama 3.1 8B FSDP, 8 H100", llama3(32, 4096, 32, 14336), 8, 1, 1, 3, 16, 2,
                  "selective", "h100", "efa", 5762});
  return runs;
}

TEST(ClusterPlan, PredictsPublishedRunsWithinTwentyFivePercent) {
  std::printf("%-40s %12s %12s %7s %6s\n", "published run", "tokens/s/GPU", "predicted", "ratio", "MFU");
  for (const PublishedRun& r : published_runs()) {
    Cluster cluster;
    cluster.gpus_per_node = std::min(8, r.gpus);
    cluster.nodes = r.gpus / cluster.gpus_per_node;
    cluster.gpu = gpu_model(r.gpu);
    cluster.network = network_model(r.network, cluster.gpu);
    Config c;
    c.model = r.model;
    c.parallel.tp = r.tp;
    c.parallel.pp = r.pp;
    c.parallel.dp = r.gpus / (r.tp * r.pp);
    c.parallel.zero = r.zero;
    c.parallel.sequence_parallel = false;
    c.train.global_batch = r.global_batch;
    c.train.micro_batch = r.micro_batch;
    c.train.recompute = parse_choice<Recompute>(r.recompute);
    StepModelOptions options;
    options.whole_layer_recompute = r.whole_layer_recompute;
    const StepPrediction p = predict_step(c, cluster, options);
    const double predicted = p.tokens_per_s / r.gpus, ratio = predicted / r.tokens_per_s_per_gpu;
    std::printf("%-40s %12.1f %12.1f %7.3f %5.1f%%\n", r.source, r.tokens_per_s_per_gpu, predicted, ratio, 100 * p.mfu);
    EXPECT_GT(ratio, 0.75) << r.source;
    EXPECT_LT(ratio, 1.25) << r.source;
  }
}

// `nodes` nodes of 8 H100s over EFA, training Llama 3 8B on 64 sequences a step.
Cluster h100s(int nodes) {
  Cluster cluster;
  cluster.nodes = nodes;
  cluster.gpu = gpu_model("h100");
  cluster.network = network_model("efa", cluster.gpu);
  return cluster;
}

Config llama3_8b() {
  Config c;
  c.model = llama3(32, 4096, 32, 14336);
  c.train.global_batch = 64;
  return c;
}

// The parts of the model each count: more recomputation costs time, a pipeline a bubble,
// tensor parallelism its all-reduces, and dp over the network more than within a node.
TEST(ClusterPlan, EachPartOfTheStepCountsWhereItShould) {
  const Cluster cluster = h100s(4);
  Config c = llama3_8b();
  c.train.micro_batch = 1;
  c.parallel.dp = 32;
  const auto predict = [&](const std::function<void(Config&)>& change) {
    Config v = c;
    change(v);
    return predict_step(v, cluster);
  };
  const StepPrediction plain = predict([](Config&) {});
  // Full: the block rerun up to the MLP's output projection (about a quarter more of the
  // step's FLOPs here), Megatron's whole-layer rerun more.
  const StepPrediction full = predict([](Config& v) { v.train.recompute = Recompute::full; });
  EXPECT_GT(full.compute_s, 1.2 * plain.compute_s);
  Config whole = c;
  whole.train.recompute = Recompute::full;
  EXPECT_GT(predict_step(whole, cluster, {.whole_layer_recompute = true}).compute_s, 1.05 * full.compute_s);
  EXPECT_GT(predict([](Config& v) { v.train.recompute = Recompute::selective; }).compute_s, plain.compute_s);
  const StepPrediction piped = predict([](Config& v) { v.parallel.dp = 8, v.parallel.pp = 4; });
  EXPECT_NEAR(piped.bubble_s / piped.compute_s, 3.0 / 8.0, 1e-9);  // (pp - 1) / m, m = 64 / 8
  EXPECT_GT(predict([](Config& v) { v.parallel.dp = 8, v.parallel.tp = 4; }).tp_s, 0.0);
  const Cluster one_node = h100s(1);
  Config within = c;
  within.parallel.dp = 8;
  within.parallel.zero = 1;
  Config across = c;
  across.parallel.zero = 1;
  EXPECT_LT(predict_step(within, one_node).dp_s * 8, predict_step(across, cluster).dp_s);  // NVLink vs EFA, per byte
  EXPECT_EQ(plain.step_s, plain.compute_s + plain.tp_s + plain.bubble_s + plain.pp_s + plain.dp_exposed_s +
                              plain.optimizer_s);
}

TEST(ClusterPlan, LayoutsFitAndComeFastestFirst) {
  const std::vector<PlannedLayout> layouts = plan_cluster(llama3_8b(), h100s(2));
  ASSERT_FALSE(layouts.empty());
  bool zero3 = false, pipelined = false;
  for (size_t i = 0; i < layouts.size(); i++) {
    const PlannedLayout& l = layouts[i];
    EXPECT_LE(static_cast<double>(l.memory.device_bytes()), 0.95 * 80 * (1 << 30)) << l.flags;
    EXPECT_EQ(l.config.parallel.dp * l.config.parallel.tp * l.config.parallel.pp, 16) << l.flags;
    if (i > 0) {  // fastest first, up to the 0.5% within which the simpler layout comes first
      EXPECT_GE(layouts[i - 1].step.tokens_per_s, l.step.tokens_per_s / 1.005) << l.flags;
    }
    zero3 |= l.config.parallel.zero == 3;
    pipelined |= l.config.parallel.pp > 1;
  }
  EXPECT_TRUE(zero3);
  EXPECT_TRUE(pipelined);
  // Llama 3 8B's states alone (16 bytes per parameter) are 120 GiB: no ZeRO-0 layout of
  // pure dp fits an 80 GiB GPU.
  for (const PlannedLayout& l : layouts)
    EXPECT_FALSE(l.config.parallel.zero == 0 && l.config.parallel.tp == 1 && l.config.parallel.pp == 1) << l.flags;
}

TEST(ClusterPlan, CommandPrintsTheBestLayoutAndBadInputIsOneError) {
  const CliRun r = run("plan --config configs/llama3-8b.ini --nodes 2 --gpus_per_node 8 --gpu h100 --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layouts fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best: sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 slurm/train.sbatch "
                       "configs/llama3-8b.ini --device=cuda --parallel.dp="),
            std::string::npos)
      << r.out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --config configs/llama3-70b.ini --nodes 1 --gpus_per_node 8 --gpu a100",
       "does not fit on 1 node(s) x 8 GPUs under any layout"},
      {"plan --config configs/llama3-8b.ini --nodes 2 --gpu b300", "--gpu must be a100, h100 or h200"},
      {"plan --config configs/llama3-8b.ini --nodes 2 --gpu h100 --network fast", "--network must be efa, ib"},
      {"plan --config configs/llama3-8b.ini --gpu h100", "--nodes is required"},
      {"plan --config configs/llama3-8b.ini --nodes 0 --gpu h100", "--nodes is required"},
  };
  for (const auto& [args, expected] : cases) {
    const CliRun bad = run(args);
    EXPECT_EQ(bad.exit_code, 2) << args << "\n" << bad.err;
    EXPECT_EQ(count(bad.err, "trident: error:"), 1) << args << "\n" << bad.err;
    EXPECT_NE(bad.err.find(expected), std::string::npos) << args << "\n" << bad.err;
  }
}

}  // namespace
}  // namespace trident
