// Pipeline parallelism under mpirun (pp = world): 1F1B, GPipe, interleaved 1F1B (two
// chunks per rank) and ZB-H1 (weight gradients deferred) give the parameters of one rank
// training the whole model alone, with the tied embedding's two copies identical, and
// the activation memory each schedule needs.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_test_helpers.h"
#include "tests/model_shapes.h"

#include <cmath>
#include <map>

#include "parallel/data_parallel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallel_state.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "pipeline/schedule.h"
#include "runtime/random.h"
#include "train/step_runner.h"

namespace trident {
namespace {

using namespace testing_helpers;

// GPT-2 (tied wte on the first and last stage) and Llama (untied: embedding first, head last).
ModelConfig four_layers(bool llama) {
  ModelConfig m = gpt2_shape(4, 2, 32, 8, 61);
  if (llama) {
    m.family = "llama";
    m.n_kv_head = 1;
    m.ffn_dim = 48;
  }
  return m;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // the tensors this stage holds
  size_t activation_bytes = 0;
};

// Three steps of m micro-batches of 2 sequences, on `pp` (null: one stage), `chunks`
// model chunks per rank.
Trained train(const ModelConfig& mc, Communicator* pp, Communicator* embedding, Schedule schedule, int m = 4,
              int chunks = 1) {
  const int stage = pp != nullptr ? pp->rank() : 0, stages = pp != nullptr ? pp->size() : 1;
  const int B = 2, T = mc.seq_len;
  auto k = kernels::make_cpu_kernels();
  auto watchdog = std::make_shared<Watchdog>();
  MpiCommunicator self(MPI_COMM_SELF, "self", watchdog);
  Transformer model(mc, *k,
                    {.micro_batch = B, .stage = stage_spec(mc.n_layer, stage, stages, "", chunks),
                     .slots = max_in_flight(schedule, stage, stages, m, chunks),
                     .chunk_slots = activation_slots(schedule, stage, stages, m, chunks).chunk_slots,
                     .split_backward = schedule == Schedule::zb1});
  model.init_parameters(21);
  DataParallel dp(self, *k, model.layout().total_floats(), 0.001, false);
  const auto adamw = make_optimizer("adamw", model.layout(), {0.9, 0.95, 1e-8, 0.1}, *k, dp.owned());
  Optimizer& opt = *adamw;
  // The mesh of this test's communicators: the pipeline, its ends, and this rank alone.
  const MeshGroups mesh{ParallelDims::resolve(stages, {{Axis::pp, stages}}), [&](AxisSet axes) -> Communicator& {
                          if (axes == AxisSet{MeshAxis::pp}) return *pp;
                          if (axes == AxisSet{MeshAxis::pp_ends}) return *embedding;
                          return self;
                        }};
  StepRunner runner(model, opt, dp, mesh, *k, {pp, schedule});
  Trained out;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * m * T), targets(tokens.size());
  for (int step = 0; step < 3; step++) {
    random_tokens(step, mc.vocab_size, tokens, targets);
    out.losses.push_back(runner.compute_gradients(tokens.data(), targets.data(), B * m, B * m));
    runner.update(3e-3, 1.0);
  }
  for (const ParameterTensor& t : model.layout().tensors()) out.params[t.name] = model.full_parameter(t.name);
  out.activation_bytes = model.activation_bytes().total();
  return out;
}

class PipelineTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (world_size() > four_layers(GetParam()).n_layer) GTEST_SKIP();
    parallel_ = std::make_unique<ParallelState>(ParallelDims::resolve(world_size(), {{Axis::pp, world_size()}}), 0, 60);
  }
  std::unique_ptr<ParallelState> parallel_;
};

TEST_P(PipelineTest, SchedulesMatchOneRankAndEachOther) {
  const ModelConfig mc = four_layers(GetParam());
  const Trained alone = train(mc, nullptr, nullptr, Schedule::one_f_one_b);
  const Trained f1b = train(mc, &parallel_->pp(), &parallel_->group({MeshAxis::pp_ends}), Schedule::one_f_one_b);
  const Trained gpipe = train(mc, &parallel_->pp(), &parallel_->group({MeshAxis::pp_ends}), Schedule::gpipe);
  for (int s = 0; s < 3; s++) {
    EXPECT_NEAR(f1b.losses[s], alone.losses[s], 1e-5) << "step " << s;
    EXPECT_NEAR(f1b.losses[s], gpipe.losses[s], 1e-5) << "step " << s;
  }
  // Parameters after 3 AdamW steps agree to float32 rounding (GPipe adds the
  // micro-batches' gradients in reverse order; Adam magnifies the last bits of tiny
  // gradients, as FORMAT.md notes for the reference).
  for (const auto& [name, values] : f1b.params) {
    EXPECT_LT(relative_error(values, gpipe.params.at(name)), 1e-4) << name;
    EXPECT_LT(relative_error(values, alone.params.at(name)), 1e-4) << name;
  }
  // The tied wte: the first stage's copy and the last stage's stay identical.
  if (!GetParam() && world_size() > 1 && (parallel_->coord(Axis::pp) == 0 || parallel_->coord(Axis::pp) == world_size() - 1)) {
    std::vector<float> wte = f1b.params.at("wte.weight"), first = wte;
    parallel_->group({MeshAxis::pp_ends}).broadcast(first, 0);
    EXPECT_EQ(wte, first);
  }
  // ZB-H1: the same steps with the weight gradients deferred, bit for bit the same sums
  // per tensor in the same order (the norms' through a stash: within float rounding).
  const Trained zb1 = train(mc, &parallel_->pp(), &parallel_->group({MeshAxis::pp_ends}), Schedule::zb1);
  for (int s = 0; s < 3; s++) EXPECT_NEAR(zb1.losses[s], f1b.losses[s], 1e-6) << "step " << s;
  for (const auto& [name, values] : f1b.params) EXPECT_LT(relative_error(values, zb1.params.at(name)), 1e-5) << name;
  // 1F1B keeps at most p - s micro-batches alive, GPipe all 4.
  if (world_size() > 1 && parallel_->coord(Axis::pp) == world_size() - 1) {
    EXPECT_LT(f1b.activation_bytes, gpipe.activation_bytes);
  }
}

// Interleaved: 2 layers per rank as two chunks (rank s holds layers s and p + s), 2p
// micro-batches (a multiple of p), against one rank alone.
TEST_P(PipelineTest, InterleavedMatchesOneRank) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "interleaving needs two stages";
  ModelConfig mc = four_layers(GetParam());
  mc.n_layer = 2 * p;
  const Trained alone = train(mc, nullptr, nullptr, Schedule::one_f_one_b, 2 * p);
  const Trained interleaved = train(mc, &parallel_->pp(), &parallel_->group({MeshAxis::pp_ends}), Schedule::interleaved, 2 * p, 2);
  for (int s = 0; s < 3; s++) EXPECT_NEAR(interleaved.losses[s], alone.losses[s], 1e-5) << "step " << s;
  for (const auto& [name, values] : interleaved.params)
    EXPECT_LT(relative_error(values, alone.params.at(name)), 1e-4) << name;
  const int stage = parallel_->coord(Axis::pp);
  EXPECT_TRUE(interleaved.params.contains(four_layers(GetParam()).family == "llama"
                                              ? "model.layers." + std::to_string(p + stage) + ".mlp.up_proj.weight"
                                              : "h." + std::to_string(p + stage) + ".mlp.c_fc.weight"));
}

INSTANTIATE_TEST_SUITE_P(Families, PipelineTest, testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt2"); });

}  // namespace
}  // namespace trident
