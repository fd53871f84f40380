// Tensor parallelism under mpirun (tp = world), for GPT-2 and Llama: the sharded model
// against its unsharded self (every rank also runs the whole model alone), the global
// gradient norm, the padded vocabulary, and the bytes the tp group moves per step
// against the formula. Llama runs with key/value heads split over tp and, where tp
// exceeds them, shared by several ranks (multi-query attention: one head for all).
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_test_helpers.h"
#include "tests/model_shapes.h"

#include <cmath>

#include "parallel/data_parallel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallel_state.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "runtime/random.h"
#include "train/setup.h"
#include "train/step_runner.h"

namespace trident {
namespace {

using namespace testing_helpers;

// Models whose heads divide by 1..4 and 6, and whose vocabulary (71) leaves whole
// padding shards at tp = 4 (V padded to 256: shards 2 and 3 hold no real word).
// Llama: 2 key/value heads (3 at tp = 3: tp must divide them or be a multiple), split
// at tp 2, shared by 2 ranks at tp 4; or 1 (multi-query), shared by all.
enum class Family { gpt2, llama_gqa, llama_mqa };

ModelConfig small_model(Family f) {
  ModelConfig m = gpt2_shape(2, 12, 48, 8, 71);
  if (f == Family::gpt2) return m;
  m.family = "llama";
  m.ffn_dim = 60;
  m.n_kv_head = f == Family::llama_mqa ? 1 : world_size() % 3 == 0 ? 3 : 2;
  return m;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int B, int T, int V, uint64_t seed) {
  Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  random_tokens(seed, V, b.tokens, b.targets);
  return b;
}

class TensorParallelTest : public testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    if (small_model(GetParam()).n_head % world_size() != 0) GTEST_SKIP() << "tp must divide 12 heads";
    parallel_ = std::make_unique<ParallelState>(ParallelDims::resolve(world_size(), {{Axis::tp, world_size()}}), 0, 60);
    shared_heads_ = shared_head_group(small_model(GetParam()), *parallel_);
  }
  TensorParallel tp() { return TensorParallel(parallel_->tp()); }
  // What the tp group moved in one optimizer step of `micro_steps` micro-batches of B.
  CommStats one_step(Transformer& model, int B, int micro_steps) {
    model.init_parameters(1);
    DataParallel dp(parallel_->dp(), *k_, model.layout().total_floats(), 1, false);
    const auto adamw = make_optimizer("adamw", model.layout(), {}, *k_, dp.owned());
    Optimizer& opt = *adamw;
    StepRunner runner(model, opt, dp, parallel_->groups(), *k_);
    const Batch batch = random_batch(B * micro_steps, model.spec().seq_len, model.spec().vocab_size, 2);
    parallel_->tp().reset_stats();
    runner.compute_gradients(batch.tokens.data(), batch.targets.data(), B * micro_steps, B * micro_steps);
    runner.update(1e-3, 1.0);
    return parallel_->tp().stats();
  }
  std::unique_ptr<ParallelState> parallel_;
  Communicator* shared_heads_ = nullptr;
  std::unique_ptr<kernels::Kernels> k_ = kernels::make_cpu_kernels();
};

TEST_P(TensorParallelTest, EveryLayerMatchesItsUnshardedSelf) {
  const ModelConfig mc = small_model(GetParam());
  const int B = 3, T = mc.seq_len;
  Transformer whole(mc, *k_, {.micro_batch = B});
  Transformer sharded(mc, *k_, {.micro_batch = B, .tp = tp()});
  whole.init_parameters(11);
  sharded.init_parameters(11);
  const Batch batch = random_batch(B, T, mc.vocab_size, 3);
  const float loss_whole = whole.forward(batch.tokens.data(), batch.targets.data(), B);
  const float loss_sharded = sharded.forward(batch.tokens.data(), batch.targets.data(), B);
  EXPECT_NEAR(loss_sharded, loss_whole, 1e-6 * std::abs(loss_whole));
  whole.store().zero_grad();
  sharded.store().zero_grad();
  whole.backward(1.0f / (B * T));
  sharded.backward(1.0f / (B * T));
  // Column-parallel qkv and MLP input, row-parallel outputs, vocabulary-parallel
  // embedding and head, and the replicated norms, wpe and biases: forward through the
  // loss, backward through every gradient. A shared key/value head's projections hold
  // each rank's part of the gradient until the step sums them (next test), so here
  // their sum over the sharing ranks is what matches.
  for (const ParameterTensor& t : sharded.layout().tensors()) {
    EXPECT_EQ(sharded.full_parameter(t.name), whole.full_parameter(t.name)) << t.name;  // same initialization
    std::vector<float> grad(sharded.store().grad(&t - sharded.layout().tensors().data()),
                            sharded.store().grad(&t - sharded.layout().tensors().data()) + t.stored);
    if (t.placement.summed_over.has(MeshAxis::tp_piece)) shared_heads_->all_reduce(std::span<float>(grad));
    const int shards = t.placement.pieces, holders = world_size() / shards;
    std::vector<float> all(t.stored * world_size()), pieces(t.stored * shards);
    std::copy(grad.begin(), grad.end(), all.begin() + parallel_->tp().rank() * t.stored);
    parallel_->tp().all_gather(all);
    for (int p = 0; p < shards; p++)
      std::copy_n(all.begin() + p * holders * t.stored, t.stored, pieces.begin() + p * t.stored);
    EXPECT_LT(relative_error(sharded.layout().assemble(t, pieces), whole.full_gradient(t.name)), 1e-5) << t.name;
  }
}

TEST_P(TensorParallelTest, ReplicatedGradientsAgreeAndTheNormCountsEachParameterOnce) {
  const ModelConfig mc = small_model(GetParam());
  const int B = 2, T = mc.seq_len;
  auto watchdog = std::make_shared<Watchdog>();
  MpiCommunicator self(MPI_COMM_SELF, "self", watchdog);
  const Batch batch = random_batch(B, T, mc.vocab_size, 9);
  std::vector<double> norms;
  std::vector<Transformer*> models;
  Transformer whole(mc, *k_, {.micro_batch = B}), sharded(mc, *k_, {.micro_batch = B, .tp = tp()});
  for (Transformer* model : {&whole, &sharded}) {
    model->init_parameters(4);
    DataParallel dp(self, *k_, model->layout().total_floats(), 1, false);
    const auto adamw = make_optimizer("adamw", model->layout(), {}, *k_, dp.owned());
    Optimizer& opt = *adamw;
    // The whole model's mesh is this rank alone; the sharded one's, the tp grid.
    MeshGroups mesh = model == &whole ? MeshGroups{ParallelDims{}, [&self](AxisSet) -> Communicator& { return self; }}
                                      : parallel_->groups();
    StepRunner runner(*model, opt, dp, std::move(mesh), *k_);
    runner.compute_gradients(batch.tokens.data(), batch.targets.data(), B, B);
    norms.push_back(runner.update(0.0, 0.0).norm);
  }
  EXPECT_NEAR(norms[1], norms[0], 1e-6 * norms[0]);
  // Replicated tensors: bit-identical gradients on every tp rank; shared key/value
  // heads: on every rank sharing them, once the step has summed their parts.
  for (const ParameterTensor& t : sharded.layout().tensors()) {
    std::vector<float> mine(sharded.store().grad(&t - sharded.layout().tensors().data()),
                            sharded.store().grad(&t - sharded.layout().tensors().data()) + t.stored);
    std::vector<float> first = mine;
    if (!t.sharded()) parallel_->tp().broadcast(first, 0);
    else if (t.placement.summed_over.has(MeshAxis::tp_piece)) shared_heads_->broadcast(first, 0);
    EXPECT_EQ(mine, first) << t.name;
  }
}

TEST_P(TensorParallelTest, PaddedVocabularyStaysOutOfTheLoss) {
  const ModelConfig mc = small_model(GetParam());
  const int B = 2, T = mc.seq_len, P = world_size();
  Transformer sharded(mc, *k_, {.micro_batch = B, .tp = tp()});
  sharded.init_parameters(8);
  // The head's table: GPT-2's tied wte, Llama's lm_head.
  const ParameterTensor& head = sharded.layout().tensor(GetParam() == Family::gpt2 ? "wte.weight" : "lm_head.weight");
  const int shard_rows = sharded.spec().padded_vocab(P) / P, first_row = parallel_->tp().rank() * shard_rows;
  // Poison the padding rows: if they took part in the softmax the loss would change.
  for (int r = 0; r < shard_rows; r++)
    if (first_row + r >= mc.vocab_size)
      for (int c = 0; c < mc.d_model; c++) sharded.store().params()[head.offset + r * mc.d_model + c] = 5.0f;
  sharded.store().parameters_changed();
  Transformer whole(mc, *k_, {.micro_batch = B});
  whole.init_parameters(8);
  const Batch batch = random_batch(B, T, mc.vocab_size, 5);
  const float expected = whole.forward(batch.tokens.data(), batch.targets.data(), B);
  EXPECT_NEAR(sharded.forward(batch.tokens.data(), batch.targets.data(), B), expected, 1e-6 * expected);
  sharded.store().zero_grad();
  sharded.backward(1.0f);
  for (int r = 0; r < shard_rows; r++) {
    if (first_row + r < mc.vocab_size) continue;
    for (int c = 0; c < mc.d_model; c++)
      ASSERT_EQ(sharded.store().grads()[head.offset + r * mc.d_model + c], 0.0f) << "padded row " << first_row + r;
  }
}

// A key/value head every tp rank shares (MQA): its gradient's sum runs over tp itself,
// one all-reduce per tensor (its bytes, its count).
std::pair<uint64_t, uint64_t> shared_head_sums(const ParameterLayout& layout, ParallelState& parallel) {
  uint64_t bytes = 0, calls = 0;
  if (parallel.dims().normalized({MeshAxis::tp_piece}) == AxisSet{MeshAxis::tp})
    for (const ParameterTensor& t : layout.tensors())
      if (t.placement.summed_over.has(MeshAxis::tp_piece)) bytes += t.stored * sizeof(float), calls++;
  return {bytes, calls};
}

TEST_P(TensorParallelTest, BytesPerStepMatchTheFormulaExactly) {
  const ModelConfig mc = small_model(GetParam());
  const int B = 2, T = mc.seq_len, L = mc.n_layer, d = mc.d_model, micro_steps = 2;
  Transformer model(mc, *k_, {.micro_batch = B, .tp = tp()});
  const CommStats s = one_step(model, B, micro_steps);
  // Per micro-batch: 2 all-reduces of B*T*d floats in the forward and 2 in the backward
  // of each block; 1 for the embedding, 1 for the head's input gradient; the loss needs
  // the row max (B*T) and the sum of exponentials with the target logit (2*B*T).
  // Per step: the squared gradient norm (one double).
  const uint64_t BT = static_cast<uint64_t>(B) * T;
  const auto [shared_bytes, shared_calls] = shared_head_sums(model.layout(), *parallel_);
  const uint64_t expected = micro_steps * 4 * ((4 * L + 2) * BT * d + 3 * BT) + sizeof(double) + shared_bytes;
  if (world_size() == 1) {
    EXPECT_EQ(s.total_bytes(), 0u);  // one rank: no communication at all
  } else {
    EXPECT_EQ(s.bytes[static_cast<int>(CommOp::all_reduce)], expected);
    EXPECT_EQ(s.total_bytes(), expected);
    EXPECT_EQ(s.calls[static_cast<int>(CommOp::all_reduce)], static_cast<uint64_t>(micro_steps * (4 * L + 4) + 1) + shared_calls);
  }
}

// Sequence parallelism: each all-reduce becomes an all-gather plus a reduce-scatter, and
// backward gathers the norms' outputs again (they are kept as this rank's rows only).
TEST_P(TensorParallelTest, SequenceParallelBytesMatchTheFormulaAndActivationsShrink) {
  ModelConfig mc = small_model(GetParam());
  mc.seq_len = 12;  // a multiple of 2, 3 and 4 ranks
  const int B = 2, T = mc.seq_len, L = mc.n_layer, d = mc.d_model, micro_steps = 2;
  // Sequence parallelism is the mesh's (the norms' gradients are summed over its sp axis).
  ParallelDims dims = parallel_->dims();
  dims.set_sequence_parallel(true);
  parallel_ = std::make_unique<ParallelState>(dims, 0, 60);
  shared_heads_ = shared_head_group(small_model(GetParam()), *parallel_);
  Transformer model(mc, *k_, {.micro_batch = B, .tp = TensorParallel(parallel_->tp(), /*sequence_parallel=*/true)});
  const CommStats s = one_step(model, B, micro_steps);
  if (world_size() == 1) {
    EXPECT_EQ(s.total_bytes(), 0u);
    return;
  }
  // Per micro-batch, buffers of B*T*d floats: per block 2 gathers and 2 reduce-scatters
  // forward, 4 gathers (the output gradient twice, the norms' outputs) and 2
  // reduce-scatters backward; the embedding 1 reduce-scatter forward, 1 gather backward;
  // the head's input 1 gather forward, 1 gather and 1 reduce-scatter backward. The loss's
  // all-reduces as without; per step the norms' gains and biases (each rank saw its rows)
  // and the gradient norm.
  const uint64_t BTd = static_cast<uint64_t>(B) * T * d * sizeof(float);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::all_gather)], micro_steps * (6 * L + 3) * BTd);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::reduce_scatter)], micro_steps * (4 * L + 2) * BTd);
  // The norms: GPT-2's two LayerNorms per block and the final one, a gain and a bias each;
  // Llama's two RMSNorms per block and the final one, a gain each; all of width d.
  const uint64_t norm_tensors = GetParam() == Family::gpt2 ? 4 * L + 2 : 2 * L + 1;
  const uint64_t norm_bytes = norm_tensors * d * sizeof(float);
  const uint64_t loss_bytes = 3 * static_cast<uint64_t>(B) * T * sizeof(float);
  const auto [shared_bytes, shared_calls] = shared_head_sums(model.layout(), *parallel_);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::all_reduce)], micro_steps * loss_bytes + norm_bytes + sizeof(double) + shared_bytes);
  EXPECT_EQ(s.calls[static_cast<int>(CommOp::all_reduce)], micro_steps * 2 + norm_tensors + 1 + shared_calls);
  // The residual stream's rows are split: fewer activation bytes than without.
  Transformer whole_rows(mc, *k_, {.micro_batch = B, .tp = tp()});
  EXPECT_LT(model.activation_bytes().per_slot, whole_rows.activation_bytes().per_slot);
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTest,
                         testing::Values(Family::gpt2, Family::llama_gqa, Family::llama_mqa), [](const auto& info) {
                           return std::string(info.param == Family::gpt2        ? "gpt2"
                                              : info.param == Family::llama_gqa ? "llama_gqa"
                                                                                : "llama_mqa");
                         });

}  // namespace
}  // namespace trident
