// Tensor parallelism under mpirun (tp = world): the sharded model against its unsharded
// self (every rank also runs the whole model alone), the global gradient norm, the
// padded vocabulary, and the bytes the tp group moves per step against the formula.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_test_helpers.h"
#include "tests/model_shapes.h"

#include <cmath>

#include "parallel/data_parallel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallel_state.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "runtime/random.h"
#include "train/step_runner.h"

namespace trident {
namespace {

using namespace testing_helpers;

// A model whose heads divide by 1..4 and 6, and whose vocabulary (71) leaves whole
// padding shards at tp = 4 (V padded to 256: shards 2 and 3 hold no real word).
ModelConfig small_model() { return gpt2_shape(2, 12, 48, 8, 71); }

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int B, int T, int V, uint64_t seed) {
  Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
  random_tokens(seed, V, b.tokens, b.targets);
  return b;
}

class TensorParallelTest : public testing::Test {
 protected:
  void SetUp() override {
    if (small_model().n_head % world_size() != 0) GTEST_SKIP() << "tp must divide 12 heads";
    parallel_ = std::make_unique<ParallelState>(ParallelDims::resolve(world_size(), 1, 1, world_size()), 0, 60);
  }
  std::unique_ptr<ParallelState> parallel_;
  std::unique_ptr<kernels::Kernels> k_ = kernels::make_cpu_kernels();
};

TEST_F(TensorParallelTest, EveryLayerMatchesItsUnshardedSelf) {
  const ModelConfig mc = small_model();
  const int B = 3, T = mc.seq_len;
  GPT2 whole(mc, B, *k_);
  GPT2 sharded(mc, B, *k_, TensorParallel(parallel_->tp()));
  whole.init_parameters(11);
  sharded.init_parameters(11);
  const Batch batch = random_batch(B, T, mc.vocab_size, 3);
  const float loss_whole = whole.forward(batch.tokens.data(), batch.targets.data(), B);
  const float loss_sharded = sharded.forward(batch.tokens.data(), batch.targets.data(), B);
  EXPECT_NEAR(loss_sharded, loss_whole, 1e-6 * std::abs(loss_whole));
  whole.zero_grad();
  sharded.zero_grad();
  whole.backward(1.0f / (B * T));
  sharded.backward(1.0f / (B * T));
  // Column-parallel c_attn/c_fc, row-parallel c_proj, vocabulary-parallel wte (embedding
  // and head), and the replicated LayerNorms, wpe and biases: forward through the loss,
  // backward through every gradient.
  for (const ParameterTensor& t : whole.layout().tensors()) {
    EXPECT_EQ(sharded.get_parameter(t.name), whole.get_parameter(t.name)) << t.name;  // same initialization
    EXPECT_LT(relative_error(sharded.get_parameter(t.name, true), whole.get_parameter(t.name, true)), 1e-5) << t.name;
  }
}

TEST_F(TensorParallelTest, ReplicatedGradientsAgreeAndTheNormCountsEachParameterOnce) {
  const ModelConfig mc = small_model();
  const int B = 2, T = mc.seq_len;
  auto watchdog = std::make_shared<Watchdog>();
  MpiCommunicator self(MPI_COMM_SELF, "self", watchdog);
  const Batch batch = random_batch(B, T, mc.vocab_size, 9);
  std::vector<double> norms;
  std::vector<GPT2*> models;
  GPT2 whole(mc, B, *k_), sharded(mc, B, *k_, TensorParallel(parallel_->tp()));
  for (GPT2* model : {&whole, &sharded}) {
    model->init_parameters(4);
    DataParallel dp(self, *k_, model->layout().total_floats(), 1, false);
    AdamW opt(model->layout(), {}, *k_, dp.owned());
    StepRunner runner(*model, opt, dp, self, *k_);
    runner.compute_gradients(batch.tokens.data(), batch.targets.data(), B, B);
    norms.push_back(runner.update(0.0, 0.0).norm);
  }
  EXPECT_NEAR(norms[1], norms[0], 1e-6 * norms[0]);
  // Replicated tensors: bit-identical gradients on every tp rank.
  for (const ParameterTensor& t : sharded.layout().tensors()) {
    if (t.sharded()) continue;
    std::vector<float> mine(sharded.grad(&t - sharded.layout().tensors().data()),
                            sharded.grad(&t - sharded.layout().tensors().data()) + t.stored);
    std::vector<float> rank0 = mine;
    parallel_->tp().broadcast(rank0, 0);
    EXPECT_EQ(mine, rank0) << t.name;
  }
}

TEST_F(TensorParallelTest, PaddedVocabularyStaysOutOfTheLoss) {
  const ModelConfig mc = small_model();
  const int B = 2, T = mc.seq_len, P = world_size();
  GPT2 sharded(mc, B, *k_, TensorParallel(parallel_->tp()));
  sharded.init_parameters(8);
  const ParameterTensor& wte = sharded.layout()[sharded.layout().wte()];
  const int shard_rows = mc.padded_vocab(P) / P, first_row = parallel_->tp().rank() * shard_rows;
  // Poison the padding rows: if they took part in the softmax the loss would change.
  for (int r = 0; r < shard_rows; r++)
    if (first_row + r >= mc.vocab_size)
      for (int c = 0; c < mc.d_model; c++) sharded.params()[wte.offset + r * mc.d_model + c] = 5.0f;
  sharded.parameters_changed();
  GPT2 whole(mc, B, *k_);
  whole.init_parameters(8);
  const Batch batch = random_batch(B, T, mc.vocab_size, 5);
  const float expected = whole.forward(batch.tokens.data(), batch.targets.data(), B);
  EXPECT_NEAR(sharded.forward(batch.tokens.data(), batch.targets.data(), B), expected, 1e-6 * expected);
  sharded.zero_grad();
  sharded.backward(1.0f);
  for (int r = 0; r < shard_rows; r++)
    if (first_row + r >= mc.vocab_size)
      for (int c = 0; c < mc.d_model; c++)
        ASSERT_EQ(sharded.grads()[wte.offset + r * mc.d_model + c], 0.0f) << "padded row " << first_row + r;
}

TEST_F(TensorParallelTest, BytesPerStepMatchTheFormulaExactly) {
  const ModelConfig mc = small_model();
  const int B = 2, T = mc.seq_len, L = mc.n_layer, d = mc.d_model, micro_steps = 2;
  GPT2 model(mc, B, *k_, TensorParallel(parallel_->tp()));
  model.init_parameters(1);
  DataParallel dp(parallel_->dp(), *k_, model.layout().total_floats(), 1, false);
  AdamW opt(model.layout(), {}, *k_, dp.owned());
  StepRunner runner(model, opt, dp, parallel_->dp(), *k_);
  const Batch batch = random_batch(B * micro_steps, T, mc.vocab_size, 2);
  parallel_->tp().reset_stats();
  runner.compute_gradients(batch.tokens.data(), batch.targets.data(), B * micro_steps, B * micro_steps);
  runner.update(1e-3, 1.0);
  const CommStats& s = parallel_->tp().stats();
  // Per micro-batch: 2 all-reduces of B*T*d floats in the forward and 2 in the backward
  // of each block; 1 for the embedding, 1 for the head's input gradient; the loss needs
  // the row max (B*T) and the sum of exponentials with the target logit (2*B*T).
  // Per step: the squared gradient norm (one double).
  const uint64_t BT = static_cast<uint64_t>(B) * T;
  const uint64_t expected = micro_steps * 4 * ((4 * L + 2) * BT * d + 3 * BT) + sizeof(double);
  if (world_size() == 1) {
    EXPECT_EQ(s.total_bytes(), 0u);  // one rank: no communication at all
  } else {
    EXPECT_EQ(s.bytes[static_cast<int>(CommOp::all_reduce)], expected);
    EXPECT_EQ(s.total_bytes(), expected);
    EXPECT_EQ(s.calls[static_cast<int>(CommOp::all_reduce)], static_cast<uint64_t>(micro_steps * (4 * L + 4) + 1));
  }
}

}  // namespace
}  // namespace trident
