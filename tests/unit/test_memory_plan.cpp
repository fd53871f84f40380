// Activation recomputation and the memory plan: what each recompute mode keeps (bytes
// counted by hand), gradients bit-identical to keeping everything even when micro-batches
// interleave in the shared buffers, and the plan's parts against the buffers the
// training setup then allocates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "model/activations.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"
#include "kernels/base/error.h"
#include "runtime/random.h"
#include "tests/model_shapes.h"
#include "plan/memory_plan.h"
#include "plan/run_layout.h"
#include "train/verify.h"

namespace trident {
namespace {

size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

// A GPT-2's buffers (LayerNorm, GELU, MLP 4 C wide; B sequences of T tokens, width C, H
// heads, a vocabulary padded to V; tp 1, fp32 on the CPU), counted by hand: what each part
// of one micro-batch's slot, the recompute set and backward's scratch hold.
struct Gpt2Buffers {
  size_t io, head, core, rest, output, backward;
  Gpt2Buffers(int B, int T, int C, int H, int V, kernels::Kernels& k) {
    const size_t BT = static_cast<size_t>(B) * T, f = 4, stats = k.attention_stats_floats(B, T, H);  // each row's log-sum-exp
    io = 2 * aligned(BT * 4) + aligned(BT * C * f);  // tokens, targets, the embedding's output
    head = aligned(BT * C * f) + 2 * aligned(BT * f) + aligned(BT * V * f) + 3 * aligned(BT * f) +
           aligned(2 * BT * f);  // final norm, its statistics, logits, losses, max, lse, sums
    core = aligned(BT * C * f) + aligned(stats * f);  // atty, its row statistics
    rest = aligned(BT * C * f) + 2 * aligned(BT * f) + aligned(BT * 3 * C * f) +  // norm_1, stats, qkv
           aligned(BT * C * f) + aligned(BT * C * f) + 2 * aligned(BT * f) +      // residual_2, norm_2
           aligned(BT * 4 * C * f) + aligned(BT * 4 * C * f);                      // fc, fc_act
    output = aligned(BT * C * f);
    backward = 2 * aligned(BT * C * f) + aligned(BT * C * f) + aligned(BT * 3 * C * f) + aligned(BT * 4 * C * f);
  }
};

TEST(Recompute, KeepsWhatEachModeSays) {
  // GPT-2, 3 layers, width 16, 4 heads, vocabulary 64: what its layers declare.
  auto k = kernels::make_cpu_kernels();
  const TransformerSpec spec = transformer_spec(gpt2_shape(3, 4, 16, 8, 64));
  const auto measure = [&](Recompute recompute, int slots) {
    return measure_activations(spec, {}, 0, 1, activation_shape(spec, {}, 2, slots, recompute, *k)).bytes;
  };
  const auto [io, head, core, rest, output, backward] = Gpt2Buffers(2, 8, 16, 4, 64, *k);

  const ActivationBytes none = measure(Recompute::none, 1);
  EXPECT_EQ(none.per_slot, io + 3 * (core + rest + output) + head);
  EXPECT_EQ(none.recompute, 0u);
  EXPECT_EQ(none.backward, backward);

  const ActivationBytes selective = measure(Recompute::selective, 1);
  EXPECT_EQ(selective.per_slot, io + 3 * (rest + output) + head);
  EXPECT_EQ(selective.recompute, core);

  const ActivationBytes full = measure(Recompute::full, 3);
  EXPECT_EQ(full.per_slot, io + 3 * output + head);
  EXPECT_EQ(full.slots, 3 * full.per_slot);
  EXPECT_EQ(full.recompute, core + rest);
  EXPECT_EQ(full.total(), full.slots + full.recompute + full.backward);

  EXPECT_THROW(parse_choice<Recompute>("some"), UsageError);

  // Full recomputation of N of the 3 blocks (train.recompute_layers): the others keep all
  // they produce, the N one block's set as under full. Each N one block's inner buffers
  // less than the last, whichever blocks the method picks: from none's (N = 0, without a
  // set) down to full's.
  for (RecomputeMethod method : {RecomputeMethod::block, RecomputeMethod::uniform}) {
    size_t last = none.per_slot;
    for (int n = 1; n <= 3; n++) {
      ActivationShape shape = activation_shape(spec, {}, 2, 1, Recompute::full, *k);
      shape.recompute_layers = n;
      shape.recompute_method = method;
      const ActivationBytes partial = measure_activations(spec, {}, 0, 1, shape).bytes;
      EXPECT_EQ(partial.per_slot, none.per_slot - n * (core + rest)) << name_of(method) << " " << n;
      EXPECT_LT(partial.per_slot, last);
      EXPECT_EQ(partial.recompute, core + rest);
      last = partial.per_slot;
    }
    EXPECT_EQ(last, full.per_slot);
  }
}

// Which blocks of a chunk partial recomputation reruns: block, the first N; uniform, N
// spread over the chunk; N = 0 or the whole chunk: all; other modes: all.
TEST(Recompute, PartialPicksTheBlocksItsMethodSays) {
  const auto picked = [](Recompute mode, int N, RecomputeMethod method, int n) {
    std::string blocks;
    for (int i = 0; i < n; i++) blocks += ActivationShape::recomputes_block(mode, N, method, i, n) ? '1' : '0';
    return blocks;
  };
  EXPECT_EQ(picked(Recompute::full, 2, RecomputeMethod::block, 5), "11000");
  EXPECT_EQ(picked(Recompute::full, 2, RecomputeMethod::uniform, 5), "00101");
  EXPECT_EQ(picked(Recompute::full, 3, RecomputeMethod::uniform, 4), "0111");
  EXPECT_EQ(picked(Recompute::full, 1, RecomputeMethod::uniform, 4), "0001");
  EXPECT_EQ(picked(Recompute::full, 4, RecomputeMethod::block, 4), "1111");
  EXPECT_EQ(picked(Recompute::full, 0, RecomputeMethod::block, 3), "111");
  EXPECT_EQ(picked(Recompute::selective, 1, RecomputeMethod::block, 3), "111");
}

// Under the interleaved schedule (here one rank holding two chunks of two layers) a slot
// holds one (micro-batch, chunk)'s blocks, the larger chunk's (the second: with its input
// buffer, where the pipeline puts it); the embedding's and the head's buffers are in
// slots of their own chunk (5 pairs in flight, 4 of chunk 0's micro-batches, 2 of chunk 1's:
// stage 0's at p 2, V 2, pipeline/schedule.h).
TEST(Recompute, InterleavedKeepsPerMicroBatchAndChunk) {
  auto k = kernels::make_cpu_kernels();
  const TransformerSpec spec = transformer_spec(gpt2_shape(4, 4, 16, 8, 64));
  StageSpec two;
  two.chunks = {{0, 2}, {2, 2}};
  const ActivationShape shape = activation_shape(spec, two, 2, 5, Recompute::none, *k, 1, false, 1, {4, 2});
  const ActivationBytes bytes = measure_activations(spec, two, 0, 1, shape).bytes;
  const size_t BT = 16, C = 16, f = 4, stats = k->attention_stats_floats(2, 8, 4);
  const size_t block = aligned(BT * 16 * f) + aligned(stats * f) + aligned(BT * C * f) + 2 * aligned(BT * f) +
                       aligned(BT * 48 * f) + aligned(BT * C * f) + aligned(BT * C * f) + 2 * aligned(BT * f) +
                       aligned(BT * 64 * f) + aligned(BT * 64 * f) + aligned(BT * C * f);  // as above
  const size_t embedding = aligned(BT * 4) + aligned(BT * C * f);                           // tokens, output
  const size_t head = aligned(BT * 4) + aligned(BT * C * f) + 2 * aligned(BT * f) + aligned(BT * 64 * f) +
                      3 * aligned(BT * f) + aligned(2 * BT * f);  // targets, final norm, ..., sums
  EXPECT_EQ(bytes.per_slot, aligned(BT * C * f) + 2 * block);
  EXPECT_EQ(bytes.chunk_own, 4 * embedding + 2 * head);
  EXPECT_EQ(bytes.slots, 5 * bytes.per_slot + bytes.chunk_own);
  // Against all of the rank's layers per micro-batch (4 of them in flight there): 5 halves.
  const ActivationBytes whole = measure_activations(spec, {}, 0, 1, activation_shape(spec, {}, 2, 4, Recompute::none, *k)).bytes;
  EXPECT_EQ(whole.per_slot, embedding + 4 * block + head);
}

// Gradients of two micro-batches whose forward and backward passes interleave as a
// pipeline's do (forward 0, forward 1, backward 1, backward 0): the second forward
// overwrites the shared recompute set, so only a real recomputation gets them right.
std::vector<float> interleaved_gradients(const ModelConfig& mc, Recompute recompute, kernels::Kernels& k,
                                        int recompute_layers = 0, RecomputeMethod method = RecomputeMethod::block) {
  const int B = 2, T = mc.seq_len;
  Transformer model(mc, k, {.micro_batch = B, .slots = 2, .recompute = recompute, .recompute_layers = recompute_layers,
                            .recompute_method = method});
  model.init_parameters(7);
  std::vector<int32_t> tokens(2 * B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(hash_key(3, 1, i) % mc.vocab_size);
    targets[i] = static_cast<int32_t>(hash_key(3, 2, i) % mc.vocab_size);
  }
  model.store().zero_grad();
  model.forward(0, tokens.data(), targets.data(), B);
  model.forward(1, tokens.data() + B * T, targets.data() + B * T, B);
  model.backward(1, 1.0f / (2 * B * T));
  model.backward(0, 1.0f / (2 * B * T));
  std::vector<float> grads(model.layout().total_floats());
  std::memcpy(grads.data(), model.store().grads(), grads.size() * sizeof(float));
  return grads;
}

TEST(Recompute, GradientsAreBitIdenticalToKeepingEverything) {
  auto k = kernels::make_cpu_kernels();
  ModelConfig llama = gpt2_shape(3, 4, 32, 8, 61);
  llama.family = "llama";
  llama.n_kv_head = 2;
  llama.ffn_dim = 88;
  for (const ModelConfig& mc : {gpt2_shape(3, 4, 32, 8, 61), llama}) {
    const std::vector<float> kept = interleaved_gradients(mc, Recompute::none, *k);
    for (Recompute r : {Recompute::selective, Recompute::full}) {
      const std::vector<float> recomputed = interleaved_gradients(mc, r, *k);
      ASSERT_EQ(kept.size(), recomputed.size());
      EXPECT_EQ(std::memcmp(kept.data(), recomputed.data(), kept.size() * sizeof(float)), 0)
          << mc.family << " recompute " << name_of(r);
    }
    // Full recomputation of some of the 3 blocks: the first (block 1), the last (uniform 1),
    // the last two (uniform 2): recomputed blocks before and after ones that keep all.
    for (const auto& [layers, method] : {std::pair{1, RecomputeMethod::block}, std::pair{1, RecomputeMethod::uniform},
                                         std::pair{2, RecomputeMethod::uniform}}) {
      const std::vector<float> partial = interleaved_gradients(mc, Recompute::full, *k, layers, method);
      ASSERT_EQ(kept.size(), partial.size());
      EXPECT_EQ(std::memcmp(kept.data(), partial.data(), kept.size() * sizeof(float)), 0)
          << mc.family << " recompute_layers " << layers << " " << name_of(method);
    }
  }
}

TEST(MemoryPlan, PartsAreTheBuffersTheSetupAllocates) {
  auto k = kernels::make_cpu_kernels();
  Config c;
  c.model = gpt2_shape(4, 4, 64, 16, 97);
  c.train.global_batch = 8;
  c.train.micro_batch = 2;
  c.parallel.dp = 4;
  c.parallel.zero = 1;
  c.parallel.bucket_mb = 0.01;
  c.train.recompute = Recompute::selective;
  const ParameterLayout layout(transformer_spec(c.model), 0, 1, 4);
  const size_t n = layout.total_floats();
  size_t optimizer_sum = 0;
  for (int r = 0; r < 4; r++) {
    const RankMemoryPlan p = plan_rank_memory(c, RankCoords().with(Axis::dp, r), *k);
    EXPECT_EQ(p.of("parameters"), n * 4);
    EXPECT_EQ(p.of("gradients"), n * 4);
    optimizer_sum += p.of("optimizer state");
    EXPECT_EQ(p.of("compute copy"), 0u);  // fp32: the layers read the parameters
    // The activations, counted by hand (Recompute.KeepsWhatEachModeSays): one micro-batch of
    // 2 sequences in flight, the 4 blocks keeping all but attention's core, which one
    // block's recompute set holds; and what the model then allocates, the same.
    const Gpt2Buffers g(2, 16, 64, 4, 128, *k);  // 97 words padded to 128
    EXPECT_EQ(p.of("activations"), g.io + 4 * (g.rest + g.output) + g.head);
    EXPECT_EQ(p.of("recompute set"), g.core);
    EXPECT_EQ(p.of("backward scratch"), g.backward);
    Transformer model(c.model, *k, {.micro_batch = 2, .buffer_multiple = 4, .recompute = Recompute::selective});
    EXPECT_EQ(p.of("activations") + p.of("recompute set") + p.of("backward scratch"), model.activation_bytes().total());
    EXPECT_EQ(p.of("checkpoint staging"), 0u);  // no checkpoint.dir
    // A quarter of each bucket's moments, two floats per parameter: a quarter of the model's
    // but for each bucket's rounding (buckets of 0.01 MB, 2,621 floats: a float off each).
    const size_t buckets = (n + 2620) / 2621;
    EXPECT_NEAR(static_cast<double>(p.of("optimizer state")), 2.0 * n * 4 / 4, 2.0 * 4 * buckets);
  }
  // ZeRO-1: the moments of the four ranks are those of the whole model once.
  EXPECT_EQ(optimizer_sum, 2 * n * 4);
  // Hybrid sharding over groups of 2: each group holds the moments once, the groups alike.
  c.parallel.shard_size = 2;
  size_t group_sum = 0;
  for (int r = 0; r < 2; r++) group_sum += plan_rank_memory(c, RankCoords().with(Axis::dp, r), *k).of("optimizer state");
  EXPECT_EQ(group_sum, 2 * n * 4);
  EXPECT_EQ(plan_rank_memory(c, RankCoords().with(Axis::dp, 2), *k).of("optimizer state"), plan_rank_memory(c, RankCoords(), *k).of("optimizer state"));
  c.parallel.shard_size = 0;
  // ZeRO-3: each rank holds 1/dp of every unit as its master parameters, gradient shard and
  // moments (4 states over the 4 ranks, once). The blocks' parameters and
  // gradients live in two windows, and so does the embeddings' unit (the tied table and
  // the positions, 128 x 64 + 16 x 64 floats: smaller than a block); the final norm alone
  // is kept. The tied table's gradient is reduced twice (after the head, after the
  // embedding): one window's shard to add the second sum through. (The embeddings' unit,
  // under 3/4 of a block, is not padded: StageSpec::windowed_ends.)
  c.parallel.zero = 3;
  const size_t n3 = ParameterLayout(transformer_spec(c.model), 0, 1, 4, {.windowed_ends = true}).total_floats();
  EXPECT_EQ(n3, n);
  const std::vector<FlatRange>& units = layout.units();
  ASSERT_EQ(units[layout.embedding_unit()].size(), 128u * 64 + 16 * 64);
  const size_t block = units[layout.block_unit(0)].size();
  EXPECT_EQ(ParamGradStore::gradient_floats_for(layout, ZeroStage::gradients),
            units[layout.embedding_unit()].size() + units[layout.head_unit()].size() + 2 * block);
  size_t states = 0;
  for (int r = 0; r < 4; r++) {
    const RankMemoryPlan p = plan_rank_memory(c, RankCoords().with(Axis::dp, r), *k);
    states += p.of("parameter shard") + p.of("gradient shard") + p.of("optimizer state");
    const size_t windowed = (units[layout.head_unit()].size() + 2 * block) * 4;
    EXPECT_EQ(p.of("parameters"), windowed);
    EXPECT_EQ(p.of("gradients"), windowed);
    EXPECT_EQ(p.of("parameter shard"), n3 * 4 / 4);
    EXPECT_EQ(p.of("accumulation buffers"), block / 4 * 4);
  }
  EXPECT_EQ(states, (2 * n3 + 2 * n) * 4);  // the moments cover the tensors only, not the padding
  // In bf16 the compute copy is what is gathered: no fp32 parameters besides the shard.
  auto bf16 = kernels::make_cpu_kernels(kernels::Precision::bf16);
  const RankMemoryPlan mixed = plan_rank_memory(c, RankCoords(), *bf16);
  EXPECT_EQ(mixed.of("parameters"), 0u);
  EXPECT_EQ(mixed.of("compute copy"), aligned(bf16->activation_bytes(units[layout.head_unit()].size() + 2 * block)));
  c.parallel.zero = 1;
  // Checkpoints add the host copy of parameters and moments, and dp rank 0's pieces.
  c.checkpoint.dir = "/nonexistent";
  const RankMemoryPlan writer = plan_rank_memory(c, RankCoords(), *k, true, 1000);
  EXPECT_EQ(writer.of("checkpoint staging"), 3 * n * 4);
  EXPECT_GT(writer.of("checkpoint pieces"), 3 * parameter_count(layout.spec()) * 4);
  EXPECT_EQ(writer.of("node's pieces"), 1000u);
  EXPECT_EQ(writer.host_bytes(), writer.of("checkpoint staging") + writer.of("checkpoint pieces") + 1000 +
                                     writer.of("checkpoint writer"));
  const RankMemoryPlan other = plan_rank_memory(c, RankCoords().with(Axis::dp, 1), *k, false);
  EXPECT_LT(other.of("checkpoint pieces"), 100u);  // only dp rank 0 writes: an empty header
  EXPECT_EQ(other.of("checkpoint writer"), 0u);
}

// Full recomputation of N layers of each pipeline stage (pp 2, 4 layers each, 2
// micro-batches in flight on stage 0): each N saves the same, a block's inner buffers per
// slot, so the plan's activations fall in equal steps from none's (less the recompute set
// that N = 1 brings) to full's; both methods alike.
// Muon's state: one float per parameter of the blocks' matrices (momentum_buffer), two for
// the other tensors (AdamW's moments), over ZeRO-1's four shards once; its work buffers
// beside it (the matrices' updates and the pieces it gathers: 6 per owned matrix float, and
// 5 of the largest matrix for the iteration).
TEST(MemoryPlan, MuonCountsAMomentumForTheMatricesAndTwoMomentsForTheRest) {
  auto k = kernels::make_cpu_kernels();
  Config c;
  c.model = gpt2_shape(2, 4, 64, 16, 97);
  c.train.global_batch = 8;
  c.train.micro_batch = 2;
  c.train.optimizer = "muon";
  c.parallel.dp = 4;
  c.parallel.zero = 1;
  const ParameterLayout layout(transformer_spec(c.model), 0, 1, 4);
  size_t matrices = 0, others = 0, largest = 0;
  for (const ParameterTensor& t : layout.tensors()) {
    const bool matrix = t.name.ends_with("c_attn.weight") || t.name.ends_with("c_proj.weight") ||
                        t.name.ends_with("c_fc.weight");
    (matrix ? matrices : others) += t.stored;
    if (matrix) largest = std::max(largest, t.numel());
  }
  EXPECT_EQ(largest, 4u * 64 * 64);  // c_fc, c_proj of the MLP
  size_t state = 0, work = 0;
  for (int r = 0; r < 4; r++) {
    const RankMemoryPlan p = plan_rank_memory(c, RankCoords().with(Axis::dp, r), *k);
    state += p.of("optimizer state");
    work += p.of("optimizer work");
    EXPECT_GT(p.of("optimizer work"), 5 * largest * 4);
  }
  EXPECT_EQ(state, (matrices + 2 * others) * 4);
  EXPECT_EQ(work, (6 * matrices + 4 * 5 * largest) * 4);
  c.train.optimizer = "adamw";
  EXPECT_EQ(plan_rank_memory(c, RankCoords(), *k).of("optimizer work"), 0u);
}

TEST(MemoryPlan, PartialRecomputeKeepsTheOtherLayers) {
  auto k = kernels::make_cpu_kernels();
  Config c;
  c.model = gpt2_shape(8, 4, 64, 16, 97);
  c.train.global_batch = 4;
  c.train.micro_batch = 1;
  c.parallel.pp = 2;
  const auto activations = [&](Recompute recompute, int layers, RecomputeMethod method) {
    Config v = c;
    v.train.recompute = recompute;
    v.train.recompute_layers = layers;
    v.train.recompute_method = method;
    resolve_for_world(v, 2);
    const RankMemoryPlan p = plan_rank_memory(v, RankCoords(), *k);
    return p.of("activations") + p.of("recompute set");
  };
  const size_t none = activations(Recompute::none, 0, RecomputeMethod::block);
  const size_t full = activations(Recompute::full, 0, RecomputeMethod::block);
  const size_t step = activations(Recompute::full, 3, RecomputeMethod::block) - full;  // one block, 2 slots
  ASSERT_GT(step, 0u);
  for (RecomputeMethod method : {RecomputeMethod::block, RecomputeMethod::uniform})
    for (int n = 1; n <= 4; n++)
      EXPECT_EQ(activations(Recompute::full, n, method), full + (4 - n) * step) << name_of(method) << " " << n;
  EXPECT_EQ(none, full + 4 * step - step / 2);  // N = 0 would be none's with a set (one block, one slot)
  // More layers than a stage has, or a negative count, is one clear error.
  Config over = c;
  over.train.recompute = Recompute::full;
  over.train.recompute_layers = 5;
  try {
    resolve_for_world(over, 2);
    ADD_FAILURE() << "5 layers of a 4-layer stage accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute_layers (5) exceeds the layers of a pipeline stage (4: "
                                         "model.n_layer 8 over parallel.pp 2)"),
              std::string::npos)
        << e.what();
  }
}

// A small Mixtral of `layers` blocks of width 64 and `experts` experts (top 2, 96 wide),
// sequences of 16 tokens, 2 per micro-batch over dp 2.
Config tiny_mixture(int layers, int experts) {
  Config c;
  c.model = gpt2_shape(layers, 4, 64, 16, 128);
  c.model.family = "mixtral";
  c.model.n_kv_head = 2;
  c.model.ffn_dim = 96;
  c.model.n_experts = experts;
  c.model.n_experts_per_token = 2;
  c.train.global_batch = 4;
  c.train.micro_batch = 2;
  c.parallel.dp = 2;
  return c;
}

// Declared buffers (StateKind::buffer) are laid out apart from the parameters and counted
// on their own line: loss-free balancing's expert bias, E floats per MoE layer (each
// buffer 64-byte aligned), on every rank, whatever ZeRO does with the parameters; the
// layout hands them to no optimizer and no gradient.
TEST(MemoryPlan, DeclaredBuffersAreCountedApartFromTheParameters) {
  auto k = kernels::make_cpu_kernels();
  Config c = tiny_mixture(3, 20);
  c.parallel.zero = 3;
  EXPECT_EQ(plan_rank_memory(c, RankCoords(), *k).of("buffers"), 0u);
  const size_t without = ParameterLayout(transformer_spec(c.model)).total_floats();
  c.model.moe_router_bias_update_rate = 1e-3;
  const ParameterLayout layout(transformer_spec(c.model));
  EXPECT_EQ(layout.total_floats(), without);  // the parameters as they were
  ASSERT_EQ(layout.buffers().size(), 3u);
  EXPECT_EQ(layout.buffers()[1].name, "model.layers.1.block_sparse_moe.gate.e_score_correction_bias");
  EXPECT_EQ(layout.buffers()[1].offset, 32u);  // 20 floats, then aligned to 16
  EXPECT_EQ(layout.buffer_floats(), 3u * 32);
  EXPECT_FALSE(layout.buffers()[0].placement.hidden_matrix);
  const RankMemoryPlan p = plan_rank_memory(c, RankCoords().with(Axis::dp, 1), *k);
  EXPECT_EQ(p.of("buffers"), 3u * 32 * 4);
  EXPECT_NE(p.describe().find("e_score_correction_bias"), std::string::npos) << p.describe();
}

// Dropless expert parallelism: the activations hold model.moe_dropless_headroom times the
// balanced share of received rows (N K of them per MoE layer and micro-batch in flight),
// each kept as the experts' gate|up (2F), activation (F), received and returned rows (2C)
// and its order (an int), up to the most the routing can send (ep min(K, local) shares).
TEST(MemoryPlan, DroplessExpertsHoldTheHeadroom) {
  auto k = kernels::make_cpu_kernels();
  Config c = tiny_mixture(2, 8);
  c.parallel.ep = 2;
  const auto plan = [&](double headroom) {
    Config h = c;
    h.model.moe_dropless_headroom = headroom;
    return plan_rank_memory(h, RankCoords(), *k);
  };
  const RankMemoryPlan one = plan(1), two = plan(2), three = plan(3);
  const size_t NK = 2 * 16 * 2, C = 64, F = 96, layers = 2;  // 2 sequences of 16 tokens, top 2
  EXPECT_EQ(two.of("activations") - one.of("activations"), layers * NK * ((3 * F + 2 * C) * 4 + 4));
  EXPECT_EQ(two.of("backward scratch") - one.of("backward scratch"), NK * (3 * F + 2 * C) * 4);
  // ep 2, 4 local experts of top 2: every token of both ranks can come here, 2 shares at most.
  EXPECT_EQ(three.total_bytes(), two.total_bytes());
  EXPECT_NE(two.describe().find("experts' rows received at 2.00x the balanced share"), std::string::npos)
      << two.describe();
  // With a capacity factor the bound is the capacity's, whatever the headroom.
  c.model.moe_capacity_factor = 1;
  EXPECT_EQ(plan(1).total_bytes(), plan(2).total_bytes());
}

// A rank more than 10% above its plan: where, by the plan's kinds measured, and the rest.
TEST(MemoryPlan, BeyondPlanSaysWhere) {
  RankMemoryPlan p;
  p.parts = {{"parameters", "fp32", 40u << 20}, {"activations", "1 in flight", 60u << 20}};
  const std::vector<MemoryPart> grown = {{"activations", "expert rows beyond the headroom", 30u << 20}};
  EXPECT_EQ(beyond_plan(p, p.total_bytes(), 110u << 20, grown), "");  // 10%: within
  EXPECT_EQ(beyond_plan(p, p.total_bytes(), 145u << 20, grown),
            "took 145.0 MiB, 145.0% of its memory plan (100.0 MiB); beyond it: activations +30.0 MiB over the plan's "
            "60.0 MiB (expert rows beyond the headroom); 15.0 MiB in no part of the plan (what the kernels, MPI and "
            "the heap keep unasked)");
}

TEST(MemoryPlan, ZeroThreeWindowsTheEndsThatFitABlocksWindow) {
  // Which units ZeRO-3 gathers around their use (parallel/param_grad_store.h) rather than
  // keeping them whole: the blocks always; an end where it fits a block's window and its
  // gradient is complete at its use.
  const auto windowed = [](const ModelConfig& m, StageSpec stage, bool defers = false) {
    const ParameterLayout layout(transformer_spec(m), 0, 1, 1, stage);
    const std::vector<bool> w = ParamGradStore::windowed_units(layout, ZeroStage::parameters, defers);
    EXPECT_EQ(ParamGradStore::windowed_units(layout, ZeroStage::gradients, defers), layout.unit_is_block());
    const auto at = [&](int u) { return u >= 0 && w[u]; };
    return std::pair{at(layout.embedding_unit()), at(layout.head_unit())};
  };
  using Ends = std::pair<bool, bool>;  // embeddings, head
  const ModelConfig gpt2 = gpt2_shape(4, 4, 64, 16, 97);
  ModelConfig llama = gpt2;  // untied
  llama.family = "llama";
  llama.n_kv_head = 2;
  llama.ffn_dim = 176;
  // Tied: the table in the windows (used at both ends), the head's unit (the final norm) kept.
  EXPECT_EQ(windowed(gpt2, {}), (Ends{true, false}));
  // Untied: both ends.
  EXPECT_EQ(windowed(llama, {}), (Ends{true, true}));
  // zb1's deferred weight gradients: kept.
  EXPECT_EQ(windowed(llama, {}, /*defers=*/true), (Ends{false, false}));
  // A pipeline: a tied table's gradient is summed between the ends after backward, so it is
  // kept on the first stage, as its copy on the last; untied ends are windowed on theirs.
  const StageSpec first{.chunks = {{0, 2}}, .has_head = false}, last{.chunks = {{2, 2}}, .has_embedding = false};
  EXPECT_EQ(windowed(gpt2, first), (Ends{false, false}));
  EXPECT_EQ(windowed(gpt2, last), (Ends{false, false}));
  EXPECT_EQ(windowed(llama, first), (Ends{true, false}));
  EXPECT_EQ(windowed(llama, last), (Ends{false, true}));
  // Ends larger than a block (a vocabulary of 4096 x 64 against 12 x 64^2): kept.
  EXPECT_EQ(windowed(gpt2_shape(4, 4, 64, 16, 4096), {}), (Ends{false, false}));
  // One block: no second window to alternate with.
  EXPECT_EQ(windowed(gpt2_shape(1, 4, 64, 16, 97), {}), (Ends{false, false}));
  // ZeRO-3's layout pads a windowed end of 3/4 of a block or more to a block's size (one
  // reduction size for every window); the tensors keep their sizes, those after a padded
  // unit move up.
  llama.vocab_size = 576;  // tables of 576 x 64 = 36,864 floats against a block's 46,208: padded
  const ParameterLayout plain(transformer_spec(llama)), padded(transformer_spec(llama), 0, 1, 1, {.windowed_ends = true});
  const size_t block = plain.largest_block();
  ASSERT_GE(4 * plain.units()[plain.embedding_unit()].size(), 3 * block);
  ASSERT_LT(plain.units()[plain.embedding_unit()].size(), block);
  ASSERT_EQ(padded.units().size(), plain.units().size());
  for (size_t u = 0; u < plain.units().size(); u++)
    EXPECT_EQ(padded.units()[u].size(), plain.unit_is_block()[u] ? plain.units()[u].size() : block) << u;
  EXPECT_EQ(padded.total_floats(), plain.total_floats() + 2 * block - plain.units()[plain.embedding_unit()].size() -
                                       plain.units()[plain.head_unit()].size());
  for (size_t i = 0; i < plain.tensors().size(); i++) {
    EXPECT_EQ(padded.tensors()[i].stored, plain.tensors()[i].stored);
    EXPECT_EQ(padded.unit_of(padded.tensors()[i].offset), plain.unit_of(plain.tensors()[i].offset));
  }
  // The verify row of a padded tied table (Cli.VerifyEveryLayoutUnderMpirun's gpt2_ref_v317):
  // its table (317 rows padded to 320) and positions, 320 x 32 + 16 x 32 floats, against a
  // block of width 32 (2 norms, c_attn, attention's c_proj, c_fc, the MLP's c_proj, each
  // with its bias), 0.85 of it: padded to the block, the head's unit (the final norm) not.
  const ModelConfig v317 = load_reference("tests/data/gpt2_ref_v317.h5").model;
  const size_t d = 32, block32 = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  const ParameterLayout table(transformer_spec(v317)), padded_table(transformer_spec(v317), 0, 1, 1, {.windowed_ends = true});
  ASSERT_EQ(table.largest_block(), block32);
  const size_t tied = 320 * d + 16 * d;
  ASSERT_EQ(table.units()[table.embedding_unit()].size(), tied);
  EXPECT_GE(4 * tied, 3 * block32);
  EXPECT_EQ(padded_table.units()[padded_table.embedding_unit()].size(), block32);
  EXPECT_EQ(padded_table.units()[padded_table.head_unit()].size(), 2 * d);
  EXPECT_EQ(padded_table.total_floats(), table.total_floats() + block32 - tied);
  EXPECT_EQ(windowed(v317, {}), (Ends{true, false}));  // in the windows, as the verify row runs it
}

}  // namespace
}  // namespace trident
