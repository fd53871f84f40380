// The whole model against the float64 PyTorch references in tests/data: loss, every
// gradient and the parameters after AdamW steps, with and without micro-batching.
#include <gtest/gtest.h>

#include <string>

#include "kernels/kernels.h"
#include "train/verify.h"

namespace trident {
namespace {

struct ReferenceCase {
  std::string file;
  int micro_batch;
};

class ReferenceTest : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(ReferenceTest, MatchesPyTorchFloat64) {
  const ReferenceCase& c = GetParam();
  const Reference ref = load_reference("tests/data/" + c.file);
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  const VerifyReport r = verify_against_reference(ref, c.micro_batch, *k, parallel, ParallelConfig{});
  EXPECT_LT(r.loss_error, VerifyReport::kLossTolerance);
  EXPECT_LT(r.max_step_loss_error, VerifyReport::kLossTolerance);
  EXPECT_LT(r.max_grad_norm_error, VerifyReport::kGradientTolerance);
  for (const TensorError& e : r.tensors) {
    EXPECT_LT(e.gradient, VerifyReport::kGradientTolerance) << e.name;
    EXPECT_LT(e.final_param, VerifyReport::kParamTolerance) << e.name;
  }
  // Every parameter of the model was compared: 2 embeddings + 12 per layer + ln_f.
  EXPECT_EQ(r.tensors.size(), static_cast<size_t>(2 + 12 * ref.model.n_layer + 2));
  EXPECT_TRUE(r.passed());
}

// gpt2_ref_a: the shipped reference (L4 H4 d64 T16 V97 B4). h6_v101: six heads, odd
// vocabulary, batch 6 (made with make_reference.py --heads 6 --dim 96 --vocab 101
// --batch 6). h3_v61: three heads, V 61, batch 3, four steps.
INSTANTIATE_TEST_SUITE_P(References, ReferenceTest,
                         ::testing::Values(ReferenceCase{"gpt2_ref_a.h5", 0}, ReferenceCase{"gpt2_ref_a.h5", 1},
                                           ReferenceCase{"gpt2_ref_a.h5", 2}, ReferenceCase{"gpt2_ref_h6_v101.h5", 0},
                                           ReferenceCase{"gpt2_ref_h6_v101.h5", 3},
                                           ReferenceCase{"gpt2_ref_h3_v61.h5", 0}),
                         [](const auto& info) {
                           std::string name = info.param.file.substr(0, info.param.file.find('.')) + "_micro" +
                                              std::to_string(info.param.micro_batch);
                           for (char& ch : name)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(ReferenceTest, DetectsAWrongModel) {
  // A reference whose parameters are perturbed must fail: the check can fail.
  Reference ref = load_reference("tests/data/gpt2_ref_a.h5");
  ref.lr *= 1.01;  // a different optimizer step moves the final parameters
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  const VerifyReport r = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
  EXPECT_LT(r.max_gradient_error(), VerifyReport::kGradientTolerance);
  EXPECT_GT(r.max_final_param_error(), VerifyReport::kParamTolerance);
  EXPECT_FALSE(r.passed());
}

}  // namespace
}  // namespace trident
