// Data parallelism under mpirun: the float64 reference passes with dp = world (with and
// without ZeRO-1, -2 and -3, one bucket or many, overlapped or not, with micro-batches), and
// training data-parallel gives the parameters of one rank training the whole batch.
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
#include "train/step_runner.h"
#include "train/verify.h"

namespace trident {
namespace {

using namespace testing_helpers;

struct Variant {
  const char* name;
  int zero;
  double bucket_mb;
  bool overlap;
  int micro_batch;  // per rank; 0: the rank's whole slice
};

class DataParallelVerify : public testing::TestWithParam<Variant> {};

TEST_P(DataParallelVerify, MatchesReference) {
  const Variant& v = GetParam();
  const int n = world_size();
  // The shipped reference has batch 4; batch 6 (h6_v101) covers dp = 3.
  const char* file = 4 % n == 0 ? "tests/data/gpt2_ref_a.h5" : "tests/data/gpt2_ref_h6_v101.h5";
  const Reference ref = load_reference(file);
  ASSERT_EQ(ref.batch % n, 0) << "no reference for dp = " << n;
  if (v.micro_batch > 0 && (ref.batch / n) % v.micro_batch != 0) GTEST_SKIP();
  ParallelState parallel(ParallelDims::resolve(n, {{Axis::dp, 0}}), 0, 60);
  ParallelConfig settings;
  settings.zero = v.zero;
  settings.bucket_mb = v.bucket_mb;
  settings.overlap = v.overlap;
  auto k = kernels::make_cpu_kernels();
  const VerifyReport r = verify_against_reference(ref, v.micro_batch, *k, parallel, settings);
  EXPECT_LT(r.loss_error, VerifyReport::kLossTolerance);
  EXPECT_LT(r.max_grad_norm_error, VerifyReport::kGradientTolerance);
  EXPECT_LT(r.max_gradient_error(), VerifyReport::kGradientTolerance);
  EXPECT_LT(r.max_final_param_error(), VerifyReport::kParamTolerance);
  EXPECT_TRUE(r.passed());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelVerify,
                         testing::Values(Variant{"plain", 0, 25, true, 0}, Variant{"zero1", 1, 25, true, 0},
                                         Variant{"many_buckets", 0, 0.02, true, 0},
                                         Variant{"zero1_many_buckets", 1, 0.02, true, 0},
                                         Variant{"no_overlap", 0, 0.02, false, 0},
                                         Variant{"zero1_micro_batches", 1, 0.05, true, 1},
                                         Variant{"zero2", 2, 25, true, 0},
                                         Variant{"zero2_micro_batches", 2, 25, true, 1},
                                         Variant{"zero3", 3, 25, true, 0},
                                         Variant{"zero3_micro_batches", 3, 25, true, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

// Parameters after a few steps: data-parallel over the world against one rank that
// trains the whole global batch alone (over MPI_COMM_SELF).
TEST(DataParallelTraining, SameParametersAsOneRank) {
  const int n = world_size();
  const ModelConfig mc = gpt2_shape(2, 2, 32, 8, 50);
  const int global_batch = 2 * n, T = mc.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(global_batch) * T), targets(tokens.size());
  auto k = kernels::make_cpu_kernels();

  const auto train = [&](Communicator& dp, bool zero) {
    const int local = global_batch / dp.size();
    Transformer model(mc, *k, {.micro_batch = local, .buffer_multiple = static_cast<size_t>(dp.size())});
    model.init_parameters(5);
    DataParallel data_parallel(dp, *k, model.layout().total_floats(), 0.001, zero);
    const auto adamw = make_optimizer("adamw", model.layout(), {0.9, 0.95, 1e-8, 0.1}, *k, data_parallel.owned());
    Optimizer& optimizer = *adamw;
    const MeshGroups mesh{ParallelDims::resolve(dp.size(), {{Axis::dp, dp.size()}}),
                          [&dp](AxisSet) -> Communicator& { return dp; }};
    StepRunner runner(model, optimizer, data_parallel, mesh, *k);
    std::vector<double> losses;
    for (int step = 0; step < 3; step++) {
      random_tokens(step, mc.vocab_size, tokens, targets);
      const size_t first = static_cast<size_t>(dp.rank()) * local * T;
      losses.push_back(runner.compute_gradients(tokens.data() + first, targets.data() + first, local, global_batch));
      runner.update(1e-2, 1.0);
    }
    std::vector<float> params;
    for (const auto& t : model.layout().tensors()) {
      const std::vector<float> p = model.full_parameter(t.name);
      params.insert(params.end(), p.begin(), p.end());
    }
    return std::make_pair(losses, params);
  };

  auto watchdog = std::make_shared<Watchdog>();
  MpiCommunicator self(MPI_COMM_SELF, "self", watchdog);
  ParallelState parallel(ParallelDims::resolve(n, {{Axis::dp, 0}}), 0, 60);
  const auto [single_losses, single_params] = train(self, false);
  for (bool zero : {false, true}) {
    const auto [losses, params] = train(parallel.dp(), zero);
    for (int s = 0; s < 3; s++) EXPECT_NEAR(losses[s], single_losses[s], 1e-5) << "step " << s << " zero " << zero;
    EXPECT_LT(relative_error(params, single_params), 1e-5) << "zero " << zero;
  }
}

}  // namespace
}  // namespace trident
