// `trident plan`'s step-time model against published training runs, each at its own
// model, batch, layout and cluster: the predicted tokens/s per GPU within 15% of what was
// reported. The runs (benchmarks/RESULTS.md lists them with the predictions):
//   Megatron-LM's weak-scaling table (its README; Narayanan et al. 2021, Table 1): GPT models
//     of 1.7B to 1T parameters on 32 to 3072 A100s (Selene: DGX A100 80GB, one 200 Gbit/s
//     InfiniBand port per GPU), s = 2048, V = 51200, full recomputation, reported in
//     teraFLOP/s per GPU by their formula 96 B s l h^2 (1 + s/6h + V/16lh) per iteration
//     (recomputation counted); micro-batch 1 and 1F1B assumed (the table does not say).
//   llm.c's GPT-2 124M run (discussion #481): 10B tokens in about 90 minutes on 8 A100s.
//   torchtitan's docs/performance.md: Llama 3 8B and 70B, Llama 2 13B and 70B with FSDP2
//     (ZeRO-3) on 64 A100s; Llama 3.1 8B with FSDP on 8 and 128 H100s (500 W), local batch 2.
//   MosaicML llm-foundry's scripts/train/benchmarking/README.md: MPT models (GPT-style:
//     learned positions, GELU MLP, V = 50368) with FSDP FULL_SHARD (ZeRO-3), amp_bf16, on
//     H100 80GB and A100 80GB (RoCE, 1600 Gbit/s per node), T = 2048; activation
//     checkpointing, where used, reruns the whole block (their HFU = 4/3 MFU).
// Also: the schedules' bubbles and memory, the layouts plan_cluster() returns (fit, fastest
// first, pinned keys kept), and what cannot work is one clear error.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>

#include "kernels/base/error.h"
#include "kernels/footprint.h"
#include "plan/cluster_plan.h"
#include "pipeline/schedule.h"
#include "plan/layer_time.h"
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
  StepModelOptions implementation;  // how its framework differs from trident's kernels
  const char* not_held = nullptr;   // why the 15% does not apply (printed, not checked)
};

ModelConfig gpt(int layers, int hidden, int heads, int seq_len, int vocab) {
  ModelConfig m;
  m.family = "gpt2";
  m.n_layer = layers;
  m.d_model = hidden;
  m.n_head = heads;
  m.seq_len = seq_len;
  m.vocab_size = vocab;
  return m;
}

// Tokens/s per GPU from Megatron's reported teraFLOP/s per GPU (their FLOP count).
double megatron_tokens(double tflops, const ModelConfig& m) {
  const double l = m.n_layer, h = m.d_model, s = m.seq_len, V = m.vocab_size;
  return tflops * 1e12 / (96.0 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)));
}

ModelConfig llama(int layers, int hidden, int heads, int kv_heads, int ffn, int seq_len, int vocab) {
  ModelConfig m;
  m.family = "llama";
  m.n_layer = layers;
  m.d_model = hidden;
  m.n_head = heads;
  m.n_kv_head = kv_heads;
  m.ffn_dim = ffn;
  m.seq_len = seq_len;
  m.vocab_size = vocab;
  return m;
}
ModelConfig llama3(int layers, int hidden, int heads, int ffn) { return llama(layers, hidden, heads, 8, ffn, 8192, 128256); }

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> runs;
  // Megatron-LM, README / Narayanan et al. 2021 Table 1: (layers, hidden, heads, tp, pp,
  // GPUs, batch, reported teraFLOP/s per GPU).
  const auto megatron = [&](const char* name, int layers, int hidden, int heads, int tp, int pp, int gpus, int batch,
                            double tflops) {
    const ModelConfig m = gpt(layers, hidden, heads, 2048, 51200);
    runs.push_back({name, m, gpus, tp, pp, 0, batch, 1, "full", "a100", "ib", megatron_tokens(tflops, m),
                    {.whole_layer_recompute = true, .flash_attention = false}});
  };
  megatron("Megatron-LM 1.7B, 32 A100", 24, 2304, 24, 1, 1, 32, 512, 137);
  megatron("Megatron-LM 3.6B, 64 A100", 30, 3072, 32, 2, 1, 64, 512, 138);
  megatron("Megatron-LM 7.5B, 128 A100", 36, 4096, 32, 4, 1, 128, 512, 142);
  megatron("Megatron-LM 18B, 256 A100", 40, 6144, 48, 8, 1, 256, 1024, 135);
  megatron("Megatron-LM 39B, 512 A100", 48, 8192, 64, 8, 2, 512, 1536, 138);
  megatron("Megatron-LM 76B, 1024 A100", 60, 10240, 80, 8, 4, 1024, 1792, 140);
  megatron("Megatron-LM 145B, 1536 A100", 80, 12288, 96, 8, 8, 1536, 2304, 148);
  megatron("Megatron-LM 310B, 1920 A100", 96, 16384, 128, 8, 16, 1920, 2160, 155);
  megatron("Megatron-LM 530B, 2520 A100", 105, 20480, 128, 8, 35, 2520, 2520, 163);
  megatron("Megatron-LM 1T, 3072 A100", 128, 25600, 160, 8, 64, 3072, 3072, 163);
  // llm.c's GPT-2 124M reproduction (its discussion #481): 10B tokens in about 90 minutes on
  // one node of 8 A100 80GB SXM, batch 524288 tokens as 8 x 64 x 1024, ZeRO-1, no recompute.
  runs.push_back({"llm.c GPT-2 124M, 8 A100", gpt(12, 768, 12, 1024, 50257), 8, 1, 1, 1, 512, 64, "none", "a100", "efa",
                  10e9 / 5400 / 8, {}});
  // torchtitan, docs/performance.md: FSDP2 (ZeRO-3), local batch 1 or 2, eager (without
  // torch.compile), InfiniBand assumed for the A100s. Its H100 runs ran on H100s capped at
  // 500 W with HBM2e at 2.4 TB/s, "between SXM and NVL" by torchtitan's own account: not
  // the H100 SXM the model knows, so they are shown, not held to the 15%.
  const StepModelOptions eager{.eager_elementwise = true};
  const char* capped = "H100 at 500 W with HBM2e (2.4 TB/s): not an H100 SXM";
  runs.push_back({"torchtitan Llama 3 8B FSDP, 64 A100", llama3(32, 4096, 32, 14336), 64, 1, 1, 3, 64, 1,
                  "selective", "a100", "ib", 2973, eager});
  runs.push_back({"torchtitan Llama 3 70B FSDP, 64 A100", llama3(80, 8192, 64, 28672), 64, 1, 1, 3, 64, 1, "full",
                  "a100", "ib", 331, eager});
  runs.push_back({"torchtitan Llama 2 13B FSDP, 64 A100", llama(40, 5120, 40, 40, 13824, 4096, 32000), 64, 1, 1, 3,
                  128, 2, "none", "a100", "ib", 2162, eager});
  runs.push_back({"torchtitan Llama 2 70B FSDP, 64 A100", llama(80, 8192, 64, 8, 28672, 4096, 32000), 64, 1, 1, 3,
                  128, 2, "full", "a100", "ib", 353, eager});
  runs.push_back({"torchtitan Llama 3.1 8B FSDP, 8 H100", llama3(32, 4096, 32, 14336), 8, 1, 1, 3, 16, 2,
                  "selective", "h100", "efa", 5762, eager, capped});
  runs.push_back({"torchtitan Llama 3.1 8B FSDP, 128 H100", llama3(32, 4096, 32, 14336), 128, 1, 1, 3, 256, 2,
                  "selective", "h100", "efa", 5605, eager, capped});
  // llm-foundry's MPT benchmarks (T = 2048, FULL_SHARD): GPUs, global batch, micro-batch,
  // activation checkpointing, reported tokens/s per GPU; mixed precision DEFAULT (fp32
  // parameters under autocast) but for the 70B on A100s (PURE: bf16).
  const auto mpt = [&](const char* name, int layers, int hidden, int heads, int gpus, int batch, int micro_batch,
                       bool checkpointing, const char* gpu, double tokens) {
    const bool pure = std::string(gpu) == "a100" && layers == 80;
    runs.push_back({name, gpt(layers, hidden, heads, 2048, 50368), gpus, 1, 1, 3, batch, micro_batch,
                    checkpointing ? "full" : "none", gpu, std::string(gpu) == "a100" ? "200" : "ib", tokens,
                    {.whole_layer_recompute = true, .fp32_weight_casts = !pure}});
  };
  mpt("MPT 1B FSDP, 8 H100", 24, 2048, 16, 8, 112, 14, false, "h100", 45455);
  mpt("MPT 3B FSDP, 64 H100", 32, 2560, 20, 64, 1152, 6, false, "h100", 22525);
  mpt("MPT 7B FSDP, 8 H100", 32, 4096, 32, 8, 48, 6, false, "h100", 10643);
  mpt("MPT 13B FSDP, 64 H100", 40, 5120, 40, 64, 128, 2, false, "h100", 4800);
  mpt("MPT 30B FSDP, 32 H100", 48, 7168, 64, 32, 1344, 14, true, "h100", 2308);
  mpt("MPT 70B FSDP, 64 H100", 80, 8192, 64, 64, 2048, 8, true, "h100", 1039);
  mpt("MPT 13B FSDP, 8 A100", 40, 5120, 40, 8, 48, 2, false, "a100", 2262);
  mpt("MPT 30B FSDP, 8 A100", 48, 7168, 64, 8, 504, 3, true, "a100", 916);
  mpt("MPT 70B FSDP, 64 A100", 80, 8192, 64, 64, 2048, 8, true, "a100", 410);
  return runs;
}

Config published_config(const PublishedRun& r) {
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
  return c;
}

Cluster published_cluster(const PublishedRun& r) {
  Cluster cluster;
  cluster.gpus_per_node = std::min(8, r.gpus);
  cluster.nodes = r.gpus / cluster.gpus_per_node;
  cluster.gpu = gpu_model(r.gpu);
  cluster.network = network_model(r.network, cluster.gpu);
  return cluster;
}

TEST(ClusterPlan, PredictsPublishedRunsWithinFifteenPercent) {
  std::printf("%-40s %12s %12s %7s %6s\n", "published run", "tokens/s/GPU", "predicted", "ratio", "MFU");
  for (const PublishedRun& r : published_runs()) {
    const StepPrediction p = predict_step(published_config(r), published_cluster(r), r.implementation);
    const double predicted = p.tokens_per_s / r.gpus, ratio = predicted / r.tokens_per_s_per_gpu;
    std::printf("%-40s %12.1f %12.1f %7.3f %5.1f%%%s%s\n", r.source, r.tokens_per_s_per_gpu, predicted, ratio,
                100 * p.mfu, r.not_held ? "  not held: " : "", r.not_held ? r.not_held : "");
    if (r.not_held) continue;
    EXPECT_GT(ratio, 0.85) << r.source;
    EXPECT_LT(ratio, 1.15) << r.source;
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
  // Across nodes a dp group of whole nodes reduces over all of their links (8 x 400 Gbit/s
  // a p5), slower than NVLink; a group of one GPU per node (tp 8) over one link, 8 times
  // slower per byte again (it moves 1/8 of the bytes).
  const StepPrediction nvlink = predict_step(within, one_node), efa = predict_step(across, cluster);
  EXPECT_GT(efa.dp_s, 1.3 * nvlink.dp_s);
  Config sparse = across;
  sparse.parallel.tp = 8;
  sparse.parallel.dp = 4;
  EXPECT_GT(predict_step(sparse, cluster).dp_s * 8, 5 * efa.dp_s);
  EXPECT_EQ(plain.step_s, plain.compute_s + plain.tp_s + plain.bubble_s + plain.pp_s + plain.dp_exposed_s +
                              plain.optimizer_s);
}

TEST(ClusterPlan, LayoutsFitAndComeFastestFirst) {
  const std::vector<PlannedLayout> layouts = plan_cluster(llama3_8b(), h100s(2));
  ASSERT_FALSE(layouts.empty());
  bool zero3 = false, pipelined = false, interleaved = false, zero_bubble = false;
  for (size_t i = 0; i < layouts.size(); i++) {
    const PlannedLayout& l = layouts[i];
    EXPECT_LE(static_cast<double>(l.memory.device_bytes()), 0.95 * 80 * (1 << 30)) << l.flags;
    EXPECT_EQ(l.config.parallel.dp * l.config.parallel.tp * l.config.parallel.cp * l.config.parallel.pp, 16) << l.flags;
    if (i > 0) {  // fastest first, up to the 0.5% within which the simpler layout comes first
      EXPECT_GE(layouts[i - 1].step.tokens_per_s, l.step.tokens_per_s / 1.005) << l.flags;
    }
    zero3 |= l.config.parallel.zero == 3;
    pipelined |= l.config.parallel.pp > 1;
    interleaved |= l.config.parallel.schedule == Schedule::interleaved;
    zero_bubble |= l.config.parallel.schedule == Schedule::zb1;
    if (l.config.parallel.pp == 1) {
      EXPECT_EQ(l.config.parallel.schedule, Schedule::one_f_one_b) << l.flags;
    }
    if (l.config.parallel.schedule != Schedule::interleaved) {
      EXPECT_EQ(l.config.parallel.vpp, 1) << l.flags;
    }
  }
  EXPECT_TRUE(zero3);
  EXPECT_TRUE(pipelined);
  EXPECT_TRUE(interleaved);
  EXPECT_TRUE(zero_bubble);
  // Llama 3 8B's states alone (16 bytes per parameter) are 120 GiB: no ZeRO-0 layout of
  // pure dp fits an 80 GiB GPU.
  for (const PlannedLayout& l : layouts)
    EXPECT_FALSE(l.config.parallel.zero == 0 && l.config.parallel.tp == 1 && l.config.parallel.pp == 1) << l.flags;
}

// GEMMs: the efficiency falls for small dimensions (a tp-8 split of a 70B model's
// projections runs below the same GEMMs unsplit), and a thin GEMM is bound by HBM.
TEST(ClusterPlan, GemmEfficiencyFallsForSmallDimensions) {
  const GpuModel& h100 = gpu_model("h100");
  const double large = gemm_efficiency({16384, 16384, 16384}, h100);
  EXPECT_LE(large, h100.gemm_efficiency);
  EXPECT_GT(large, 0.95 * h100.gemm_efficiency);
  const double unsplit = gemm_efficiency({8192, 8192, 8192}, h100);  // Llama 70B's attention out, B T = 8192
  EXPECT_LT(gemm_efficiency({8192, 8192, 1024}, h100), 0.95 * unsplit);  // its tp-8 share: 8% less
  EXPECT_LT(gemm_efficiency({1024, 1024, 1024}, h100), 0.6 * large);
  // 2 x 8192 x 8 x 8192 FLOPs over 2 x (8192 x 8192 + 2 x 8192 x 8) bytes: 8 FLOP per byte, HBM-bound.
  const GemmShape thin{8192, 8, 8192};
  EXPECT_NEAR(gemm_seconds(thin, h100), 2 * (8192.0 * 8192 + 2 * 8192 * 8) / (3.35e12 * h100.hbm_efficiency), 1e-12);
}

// The schedules' bubbles (plan/schedule_time.h) on Llama 3 8B over 4 stages, 8 micro-batches:
// interleaved's is 1F1B's over V, zero bubble's (p - 1) max(F, B, F + B - W), below 1F1B's; GPipe
// has 1F1B's bubble. Interleaved sends V times the transfers.
TEST(ClusterPlan, SchedulesBubbleAsTheirFormulas) {
  const Cluster cluster = h100s(4);
  Config c = llama3_8b();
  c.train.micro_batch = 1;
  c.parallel.dp = 8;
  c.parallel.pp = 4;
  const auto with = [&](Schedule schedule, int vpp) {
    Config v = c;
    v.parallel.schedule = schedule;
    v.parallel.vpp = vpp;
    return predict_step(v, cluster);
  };
  const StepPrediction one_f_one_b = with(Schedule::one_f_one_b, 1);
  const double F = one_f_one_b.forward_s, B = one_f_one_b.input_grad_s, W = one_f_one_b.weight_grad_s;
  EXPECT_NEAR(one_f_one_b.bubble_s, 3 * (F + B + W), 1e-12);
  EXPECT_GT(W, 0.5 * F);  // GEMM-bound: W about F
  EXPECT_LT(W, 1.5 * F);
  EXPECT_EQ(with(Schedule::gpipe, 1).bubble_s, one_f_one_b.bubble_s);
  for (int vpp : {2, 4}) {
    const StepPrediction interleaved = with(Schedule::interleaved, vpp);
    EXPECT_NEAR(interleaved.bubble_s, one_f_one_b.bubble_s / vpp, 1e-12) << vpp;
    EXPECT_NEAR(interleaved.pp_s, vpp * one_f_one_b.pp_s, 1e-12) << vpp;
    EXPECT_EQ(interleaved.compute_s, one_f_one_b.compute_s);
  }
  const StepPrediction zb1 = with(Schedule::zb1, 1);
  EXPECT_NEAR(zb1.bubble_s, 3 * std::max({F, B, F + B - W}), 1e-12);
  EXPECT_LT(zb1.bubble_s, 0.5 * one_f_one_b.bubble_s);
  EXPECT_LT(zb1.step_s, one_f_one_b.step_s);
}

// Activation slots per schedule (each holds a micro-batch's activations for all of the
// rank's layers, under interleaved a (micro-batch, chunk)'s for one chunk's layers;
// pipeline/schedule.h counts them): on the first stage GPipe holds all m, interleaved at
// V 2 2(p-1) + p + 1 halves (1.375x 1F1B's p at p 4), zero bubble p as 1F1B; on the last
// stage 1F1B one, zero bubble p. The memory plan sizes the activations by them (the last stage's slots hold the
// logits too; zero bubble's keep a little more for the deferred weight gradients).
TEST(ClusterPlan, SchedulesHoldTheirActivations) {
  EXPECT_EQ(max_in_flight(Schedule::gpipe, 0, 4, 32), 32);
  EXPECT_EQ(max_in_flight(Schedule::one_f_one_b, 0, 4, 32), 4);
  EXPECT_EQ(max_in_flight(Schedule::one_f_one_b, 3, 4, 32), 1);
  EXPECT_EQ(max_in_flight(Schedule::zb1, 0, 4, 32), 4);
  EXPECT_EQ(max_in_flight(Schedule::zb1, 3, 4, 32), 4);
  EXPECT_EQ(max_in_flight(Schedule::interleaved, 0, 4, 32, 2), 11);
  EXPECT_GE(max_in_flight(Schedule::interleaved, 0, 4, 32, 4), max_in_flight(Schedule::interleaved, 0, 4, 32, 2));

  Config c = llama3_8b();
  c.train.device = Device::cuda;
  c.train.precision = PrecisionSetting::bf16;
  c.train.micro_batch = 1;
  c.parallel.tp = 8;
  c.parallel.pp = 4;
  c.parallel.dp = 2;  // 32 micro-batches a step
  const std::unique_ptr<kernels::Footprint> k = kernels::cuda_footprint(kernels::Precision::bf16);
  const auto activations = [&](Schedule schedule, int vpp, int stage) {
    Config v = c;
    v.parallel.schedule = schedule;
    v.parallel.vpp = vpp;
    return static_cast<double>(plan_rank_memory(v, RankCoords().with(Axis::pp, stage), *k, true, 0, true).of("activations"));
  };
  const double first = activations(Schedule::one_f_one_b, 1, 0), last = activations(Schedule::one_f_one_b, 1, 3);
  EXPECT_EQ(activations(Schedule::gpipe, 1, 0), first / 4 * 32);
  // 11 halves of the stage's layers, each with its input (the hidden states the pipeline
  // brings), and the embedding's output for each of chunk 0's 8 micro-batches: within 6%
  // of 11/8 of 1F1B's (where the old slots, all the layers per micro-batch, held 6/4).
  EXPECT_GT(activations(Schedule::interleaved, 2, 0), first / 8 * 11);
  EXPECT_LT(activations(Schedule::interleaved, 2, 0), first / 8 * 11 * 1.06);
  EXPECT_GE(activations(Schedule::zb1, 1, 0), first);
  EXPECT_LT(activations(Schedule::zb1, 1, 0), 1.01 * first);
  EXPECT_GE(activations(Schedule::zb1, 1, 3), 4 * last);
  EXPECT_LT(activations(Schedule::zb1, 1, 3), 1.01 * 4 * last);
}

Config llama3_70b() {
  Config c;
  c.model = llama3(80, 8192, 64, 28672);
  c.train.global_batch = 1024;
  return c;
}

// A key set by the user pins it: every layout listed has its value.
TEST(ClusterPlan, PinnedKeysKeepTheirValues) {
  Config c = llama3_70b();
  c.parallel.tp = 8;
  c.parallel.zero = 1;
  c.parallel.schedule = Schedule::interleaved;
  const LayoutPins pins = layout_pins({"parallel.tp", "parallel.zero", "parallel.schedule", "model.n_layer"}, c);
  EXPECT_EQ(pins.keys, (std::set<std::string>{"parallel.tp", "parallel.zero", "parallel.schedule"}));
  EXPECT_EQ(pins.describe(c), "parallel.tp=8, parallel.schedule=interleaved, parallel.zero=1");
  const std::vector<PlannedLayout> layouts = plan_cluster(c, h100s(8), pins);
  ASSERT_FALSE(layouts.empty());
  std::set<int> vpps;
  for (const PlannedLayout& l : layouts) {
    EXPECT_EQ(l.config.parallel.tp, 8) << l.flags;
    EXPECT_EQ(l.config.parallel.zero, 1) << l.flags;
    EXPECT_EQ(l.config.parallel.schedule, Schedule::interleaved) << l.flags;
    EXPECT_GT(l.config.parallel.pp, 1) << l.flags;
    vpps.insert(l.config.parallel.vpp);
  }
  EXPECT_EQ(vpps, (std::set<int>{2, 4}));
  // Unpinned, the same cluster lists other tp sizes and ZeRO stages too.
  std::set<int> tps;
  for (const PlannedLayout& l : plan_cluster(c, h100s(8))) tps.insert(l.config.parallel.tp);
  EXPECT_GT(tps.size(), 1u);
  // dp = 0 (derived) and micro_batch = 0 (the whole per-rank batch) pin nothing.
  EXPECT_FALSE(layout_pins({"parallel.dp", "train.micro_batch"}, llama3_70b()).any());
}

// Llama 2 70B with ZeRO-3 over 96 H100s at micro-batch 2 (4096 tokens): its activations
// kept whole do not fit, every layer recomputed does, and the planner picks the fewest
// layers recomputed that fit (train.recompute_layers): one fewer does not fit; the step
// is faster than full recomputation's.
TEST(ClusterPlan, PicksTheFewestRecomputedLayersThatFit) {
  Config c;
  c.model = llama(80, 8192, 64, 8, 28672, 4096, 32000);
  c.train.global_batch = 192;
  c.train.micro_batch = 2;
  c.parallel.zero = 3;
  c.train.recompute = Recompute::full;
  const Cluster cluster = h100s(12);
  const LayoutPins pins =
      layout_pins({"parallel.tp", "parallel.pp", "parallel.zero", "train.micro_batch", "train.recompute"}, c);
  const std::vector<PlannedLayout> layouts = plan_cluster(c, cluster, pins);
  ASSERT_EQ(layouts.size(), 1u);
  const PlannedLayout& l = layouts[0];
  const int n = l.config.train.recompute_layers;
  ASSERT_GT(n, 0);
  ASSERT_LT(n, 80);
  EXPECT_NE(l.flags.find("--train.recompute=full --train.recompute_layers=" + std::to_string(n) +
                         " --train.recompute_method=block"),
            std::string::npos)
      << l.flags;
  const auto footprint = kernels::cuda_footprint(kernels::Precision::bf16);
  const double usable = 0.95 * cluster.gpu.memory_gib * (1 << 30);
  const auto bytes = [&](Recompute recompute, int layers) {
    Config v = l.config;
    v.train.recompute = recompute;
    v.train.recompute_layers = layers;
    return static_cast<double>(plan_rank_memory(v, RankCoords(), *footprint, true, 0, true).device_bytes());
  };
  EXPECT_EQ(bytes(Recompute::full, n), static_cast<double>(l.memory.device_bytes()));
  EXPECT_LE(bytes(Recompute::full, n), usable);
  EXPECT_GT(bytes(Recompute::full, n - 1), usable) << n - 1 << " layers";
  EXPECT_GT(bytes(Recompute::none, 0), usable);
  Config full = l.config;
  full.train.recompute_layers = 0;
  const StepPrediction all = predict_step(full, cluster);
  EXPECT_LT(l.step.compute_s, all.compute_s);
  // The rerun counts per recomputed layer: n of 80 of full's extra compute.
  Config none = l.config;
  none.train.recompute = Recompute::none;
  none.train.recompute_layers = 0;
  const double plain = predict_step(none, cluster).compute_s;
  EXPECT_NEAR(l.step.compute_s - plain, (all.compute_s - plain) * n / 80, 1e-9 * plain);
  std::printf("Llama 2 70B, ZeRO-3 over 96 H100s, micro-batch 2: %d of 80 layers recomputed, %.1f GiB, "
              "%.0f tokens/s (full: %.0f)\n",
              n, gib(bytes(Recompute::full, n)), l.step.tokens_per_s, all.tokens_per_s);
}

// A pinned layout that cannot work is one error naming the keys, and why: a rule of the
// layout (as a run would say it) or the memory it takes against the GPU's.
TEST(ClusterPlan, PinnedLayoutThatCannotWorkSaysWhy) {
  const auto error_of = [](const Config& c, const Cluster& cluster, const std::set<std::string>& keys) {
    try {
      plan_cluster(c, cluster, layout_pins(keys, c));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Config tp16 = llama3_70b();
  tp16.parallel.tp = 16;
  const std::string across_nodes = error_of(tp16, h100s(8), {"parallel.tp"});
  EXPECT_NE(across_nodes.find("no layout with parallel.tp=16 works on 8 node(s) x 8 GPUs"), std::string::npos) << across_nodes;
  EXPECT_NE(across_nodes.find("must divide the GPUs of a node (8)"), std::string::npos) << across_nodes;

  Config vpp3 = llama3_70b();
  vpp3.parallel.pp = 4;
  vpp3.parallel.schedule = Schedule::interleaved;
  vpp3.parallel.vpp = 3;  // 20 layers a stage
  const std::string chunks = error_of(vpp3, h100s(8), {"parallel.pp", "parallel.schedule", "parallel.vpp"});
  EXPECT_NE(chunks.find("parallel.vpp (3) must divide the layers of every stage: stage 0 has 20"), std::string::npos)
      << chunks;

  Config micro = llama3_70b();
  micro.train.micro_batch = 3;
  micro.parallel.tp = 8;
  micro.parallel.pp = 8;
  const std::string batch = error_of(micro, h100s(8), {"train.micro_batch", "parallel.tp", "parallel.pp"});
  EXPECT_NE(batch.find("train.micro_batch (3) must divide the per-rank batch 1024"), std::string::npos) << batch;

  Config lean = llama3_70b();
  lean.parallel.tp = 1;
  lean.parallel.zero = 0;
  const std::string memory = error_of(lean, h100s(2), {"parallel.tp", "parallel.zero"});
  EXPECT_NE(memory.find("the layouts with parallel.tp=1, parallel.zero=0 do not fit on 2 node(s) x 8 GPUs: the leanest "
                        "needs"),
            std::string::npos)
      << memory;
  EXPECT_NE(memory.find("GiB per GPU; a H100 SXM 80GB has 80.0 GiB (95% usable). It is --parallel.dp="), std::string::npos)
      << memory;
  EXPECT_NE(memory.find("optimizer state"), std::string::npos) << memory;  // the leanest layout's parts
}

// An INI of Llama 3 70B's shape and batch with no layout key: the planner chooses all of it.
std::string unpinned_70b_ini() {
  const std::string path = testing::TempDir() + "llama3-70b-unpinned.ini";
  std::ofstream(path) << "[model]\nfamily = llama\nn_layer = 80\nn_head = 64\nn_kv_head = 8\nd_model = 8192\n"
                         "ffn_dim = 28672\nseq_len = 8192\nvocab_size = 128256\n[train]\nglobal_batch = 1024\n";
  return path;
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
      {"plan --config " + unpinned_70b_ini() + " --nodes 1 --gpus_per_node 8 --gpu a100",
       "does not fit on 1 node(s) x 8 GPUs under any layout"},
      // The config file pins tp 8 and pp 4: 32 GPUs, not 8.
      {"plan --config configs/llama3-70b.ini --nodes 1 --gpus_per_node 8 --gpu a100",
       "no layout with parallel.tp=8, parallel.pp=4, parallel.zero=1, train.micro_batch=1 works on 1 node(s) x 8 GPUs: "
       "parallel.tp x parallel.pp (8 x 4) must divide the cluster's 8 GPUs"},
      {"plan --config configs/llama3-70b.ini --nodes 4 --gpu h100 --parallel.pp=1 --parallel.zero=0",
       "the layouts with parallel.tp=8, parallel.pp=1, parallel.zero=0, train.micro_batch=1 do not fit on 4 node(s) x 8 GPUs"},
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

// The best layout of Llama 3 70B and Llama 2 70B on 8 and 16 p5 nodes names its schedule;
// the config files pin tp 8, pp 4, ZeRO-1 and micro-batch 1, the planner chooses the rest.
TEST(ClusterPlan, BestLayoutOf70bModelsNamesItsSchedule) {
  for (const char* config : {"configs/llama3-70b.ini", "configs/llama2-70b.ini"})
    for (int nodes : {8, 16}) {
      const std::string args = std::string("plan --config ") + config + " --nodes " + std::to_string(nodes) + " --gpu h100";
      const CliRun r = run(args);
      ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
      const size_t best = r.out.find("best: sbatch");
      ASSERT_NE(best, std::string::npos) << r.out;
      EXPECT_NE(r.out.find("--parallel.schedule=", best), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("pinned (set in the config or by flags): parallel.tp=8, parallel.pp=4"), std::string::npos)
          << r.out;
      std::printf("%s\n%s", args.c_str(), r.out.c_str());
    }
}

TEST(ClusterPlan, LongSequencesGetContextParallelism) {
  // Llama 3 8B at 128K tokens on 8 nodes: one rank cannot hold a sequence's activations
  // (the config pins tp 2, pp 1, ZeRO-1), so every layout that fits splits the sequence.
  const std::string args = "plan --config configs/llama3-8b.ini --model.seq_len=131072 --train.global_batch=16 "
                           "--nodes 8 --gpu h100";
  const CliRun r = run(args);
  ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  const size_t best = r.out.find("best: sbatch");
  ASSERT_NE(best, std::string::npos) << r.out;
  const size_t cp = r.out.find("--parallel.cp=", best);
  ASSERT_NE(cp, std::string::npos) << r.out;
  EXPECT_GT(std::stoi(r.out.substr(cp + 14)), 1) << r.out;
  std::printf("%s\n%s", args.c_str(), r.out.c_str());
}

// A mixture of experts costs the work of its active experts (top-k of E), each expert's
// GEMMs on its share of the rows: Mixtral 8x7B against the dense Llama with the same
// active width (2 x 14336) on the same layout: more time (8 GEMMs of a quarter of the rows
// run further from the peak, and the router), not 4x more; MFU counts active parameters.
// Expert parallelism's exchanges cost the formula's time. `plan` prints a layout for 8 and
// 16 p5 nodes, with the experts split over ranks.
TEST(ClusterPlan, ExpertsCostTheirActiveWork) {
  const Cluster cluster = h100s(8);
  Config moe;
  moe.model = llama(32, 4096, 32, 8, 14336, 4096, 32000);
  moe.model.family = "mixtral";
  moe.model.n_experts = 8;
  moe.model.n_experts_per_token = 2;
  moe.train.global_batch = 64;
  moe.train.micro_batch = 1;
  moe.parallel.dp = 2;
  moe.parallel.tp = 8;
  moe.parallel.pp = 4;
  Config dense = moe;
  dense.model.family = "llama";
  dense.model.n_experts = 0;
  dense.model.ffn_dim = 2 * 14336;
  const StepPrediction m = predict_step(moe, cluster), d = predict_step(dense, cluster);
  EXPECT_GT(m.compute_s, d.compute_s);
  EXPECT_LT(m.compute_s, 1.5 * d.compute_s);
  // The same model FLOPs (active parameters, plus the router's 8 x 4096 per layer), so MFU
  // falls with the time.
  EXPECT_NEAR(m.mfu / d.mfu, d.step_s / m.step_s, 0.01);
  // Expert parallelism over the 2 dp ranks: tp 8 fills a node, so the other ep rank is on
  // another node and half of each exchange's rows (a micro-batch's 4096 tokens x 2 experts
  // x 4096, bf16) cross the network; 4 exchanges per MoE layer and micro-batch, 8 layers on
  // the busiest stage, 32 micro-batches. The experts' gradients are no longer summed over dp.
  Config ep = moe;
  ep.parallel.ep = 2;
  const StepPrediction e = predict_step(ep, cluster);
  EXPECT_EQ(m.ep_s, 0.0);
  EXPECT_NEAR(e.ep_s, 32 * 8 * 4 * (4096.0 * 2 * 4096 * 2) / 2 / cluster.network.bus_bytes_per_s(), 1e-9);
  EXPECT_LT(e.dp_s, 0.5 * m.dp_s);
  EXPECT_DOUBLE_EQ(e.compute_s, m.compute_s);
  for (int nodes : {8, 16}) {
    const std::string args = "plan --config configs/mixtral-8x7b.ini --nodes " + std::to_string(nodes) + " --gpu h100";
    const CliRun r = run(args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_NE(r.out.find("E8x14336 top2 T4096 V32000 (46.70B parameters, 12.88B active)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("best: sbatch --nodes=" + std::to_string(nodes)), std::string::npos) << r.out;
    // The best layout splits the experts (all-to-all within a node beats summing every
    // expert's gradients over dp).
    const size_t best = r.out.find("best: sbatch"), flag = r.out.find("--parallel.ep=", best);
    ASSERT_NE(flag, std::string::npos) << r.out;
    EXPECT_GT(std::stoi(r.out.substr(flag + 14)), 1) << r.out;
    // Dropless: its GPUs keep room for twice the balanced share of the experts' rows
    // (model.moe_dropless_headroom; MemoryPlan.DroplessExpertsHoldTheHeadroom counts it).
    EXPECT_NE(r.out.find("experts' rows received at 2.00x the balanced share"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("compute + tp + all-to-all + bubble"), std::string::npos) << r.out;
    std::printf("%s\n%s", args.c_str(), r.out.c_str());
  }
}

// parallel.ep given is pinned like the other layout keys (issue 55: it was dropped
// silently): every layout keeps it; one that cannot split the experts is one error.
TEST(ClusterPlan, PinnedExpertParallelismKeepsItsValue) {
  Config moe;
  moe.model = llama(32, 4096, 32, 8, 14336, 4096, 32000);
  moe.model.family = "mixtral";
  moe.model.n_experts = 8;
  moe.model.n_experts_per_token = 2;
  moe.train.global_batch = 64;
  moe.parallel.ep = 8;
  const LayoutPins pins = layout_pins({"parallel.ep"}, moe);
  EXPECT_EQ(pins.describe(moe), "parallel.ep=8");
  const std::vector<PlannedLayout> layouts = plan_cluster(moe, h100s(8), pins);
  ASSERT_FALSE(layouts.empty());
  for (const PlannedLayout& l : layouts) {
    EXPECT_EQ(l.config.parallel.ep, 8) << l.flags;
    EXPECT_NE(l.flags.find("--parallel.ep=8"), std::string::npos) << l.flags;
  }
  moe.parallel.ep = 3;  // divides neither the 8 experts nor any dp of 64 GPUs
  try {
    plan_cluster(moe, h100s(8), layout_pins({"parallel.ep"}, moe));
    ADD_FAILURE() << "parallel.ep=3 was planned";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no layout with parallel.ep=3 works on 8 node(s) x 8 GPUs: parallel.ep (3) must"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trident
