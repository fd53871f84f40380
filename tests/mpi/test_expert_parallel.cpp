// Expert parallelism under mpirun (ep = world) where the routing is as unbalanced as it
// can be: every rank's model against the whole model run alone on the same batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "mpi_test_helpers.h"
#include "model/transformer.h"
#include "parallel/parallel_state.h"
#include "tests/model_shapes.h"

namespace trident {
namespace {

using namespace testing_helpers;

// Mixtral's shapes, small: 12 experts (ep 2, 3 and 4 divide them; each rank holds 3 or
// more, so experts 0 and 1 are both ep rank 0's), top 2, with both router losses.
ModelConfig twelve_experts() {
  ModelConfig m = gpt2_shape(2, 4, 32, 8, 61);
  m.family = "mixtral";
  m.n_kv_head = 2;
  m.ffn_dim = 24;
  m.n_experts = 12;
  m.n_experts_per_token = 2;
  m.router_aux_loss_coef = 0.01;
  m.router_z_loss_coef = 0.001;
  return m;
}

// The routers' weights set to 0: every logit 0, every expert's score the same, and top-k
// takes the lowest indices: every token goes to experts 0 and 1, on ep rank 0. That rank's
// experts receive ep times the rows it sends, the others none. The loss and every gradient
// are the whole model's on the rank's batch; each expert's gradient summed over the ranks'
// tokens (its holder's) is the sum of the whole model's over the ranks. Dropless (0), with
// no headroom (model.moe_dropless_headroom 1: the arena holds the balanced share), the rows
// beyond it go to model/layers/moe.cpp's grown buffers; with a capacity factor the arena holds its bound: at 6 (no drop: a sequence's 8
// tokens fit each expert) the rows reach it exactly, at 3 half of them are dropped.
class ExpertParallel : public testing::TestWithParam<double> {};

TEST_P(ExpertParallel, RowsBeyondTheBalancedShareMatchTheWholeModel) {
  const int ep = world_size(), rank = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  ParallelDims dims = ParallelDims::resolve(ep, {{Axis::dp, 0}});
  dims.set_ep(ep);
  ParallelState parallel(dims, 0, 60);
  ASSERT_NE(parallel.expert_parallel(), nullptr);
  ModelConfig mc = twelve_experts();
  mc.moe_capacity_factor = GetParam();
  mc.moe_dropless_headroom = 1;  // (the default's 2 would hold all of ep 2's rows)
  const int B = 2, T = mc.seq_len;
  auto k = kernels::make_cpu_kernels();
  Transformer whole(mc, *k, {.micro_batch = B});
  StageSpec stage;
  stage.ep = ep;
  stage.ep_rank = parallel.expert_parallel()->rank();
  Transformer sharded(mc, *k, {.micro_batch = B, .stage = stage, .region_groups = parallel.groups().group,
                               .expert_parallel = parallel.expert_parallel()});
  int routers = 0;
  for (Transformer* model : {&whole, &sharded}) {
    model->init_parameters(5);
    for (const ParameterTensor& t : model->layout().tensors())
      if (t.name.ends_with(".gate.weight")) {
        const std::vector<float> zero(t.stored, 0.0f);
        model->set_parameter(t.name, zero.data(), zero.size());
        routers++;
      }
  }
  ASSERT_EQ(routers, 2 * mc.n_layer);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  random_tokens(40 + rank, mc.vocab_size, tokens, targets);  // each rank its own batch
  const float loss_whole = whole.forward(tokens.data(), targets.data(), B);
  const float loss_sharded = sharded.forward(tokens.data(), targets.data(), B);
  EXPECT_NEAR(loss_sharded, loss_whole, 1e-6 * loss_whole);
  whole.store().zero_grad();
  sharded.store().zero_grad();
  whole.backward(1.0f / (B * T));
  sharded.backward(1.0f / (B * T));
  // Dropless, rank 0's experts took every rank's rows, beyond its share; the others' none.
  // Within a capacity factor's bound nothing grows.
  if (rank == 0 && mc.moe_capacity_factor == 0) {
    EXPECT_GT(sharded.grown_bytes(), 0u);
  } else {
    EXPECT_EQ(sharded.grown_bytes(), 0u);
  }
  // Rank 0 received every rank's N K rows (dropless): their order, N K ep ints, was
  // uploaded within what the model reserved (a GPU's pinned staging grows nowhere).
  EXPECT_EQ(k->uploads_beyond_reserve(), 0u);
  int compared = 0;
  for (const ParameterTensor& t : whole.layout().tensors()) {
    std::vector<float> expected = whole.full_gradient(t.name);
    const bool expert = t.name.find(".experts.") != std::string::npos;
    if (expert) MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(expected.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (!sharded.layout().has(t.name)) {
      EXPECT_TRUE(expert) << t.name << " is held by every rank";
      continue;
    }
    EXPECT_LT(relative_error(sharded.full_gradient(t.name), expected), 1e-5) << t.name;
    compared++;
  }
  // Every tensor but the experts of the other ranks: attention, norms, routers, the ends.
  const int experts_here = mc.n_experts / ep, expert_tensors = 3 * mc.n_layer;  // per expert: w1, w2, w3 per layer
  EXPECT_EQ(compared, static_cast<int>(whole.layout().tensors().size()) - (mc.n_experts - experts_here) * expert_tensors);
}

INSTANTIATE_TEST_SUITE_P(CapacityFactors, ExpertParallel, testing::Values(0.0, 3.0, 6.0), [](const auto& info) {
  return info.param == 0 ? std::string("dropless") : "capacity_" + std::to_string(static_cast<int>(info.param));
});

}  // namespace
}  // namespace trident
