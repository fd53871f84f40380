// The whole model against the float64 PyTorch references in tests/data: loss, every
// gradient and the parameters after AdamW steps, with and without micro-batching.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/hdf5_file.h"
#include "kernels/kernels.h"
#include "kernels/base/error.h"
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
  // Every parameter of the model was compared. GPT-2: 2 embeddings + 12 per layer +
  // ln_f; Llama: the embedding, 9 per layer, the final norm, lm_head.
  const bool llama = ref.model.family == "llama";
  EXPECT_EQ(r.tensors.size(), static_cast<size_t>(llama ? 9 * ref.model.n_layer + 3 : 2 + 12 * ref.model.n_layer + 2));
  EXPECT_TRUE(r.passed());
}

// gpt2_ref_a: the shipped reference (L4 H4 d64 T16 V97 B4). h6_v101: six heads, odd
// vocabulary, batch 6 (made with make_reference.py --heads 6 --dim 96 --vocab 101
// --batch 6). h3_v61: three heads, V 61, batch 3, four steps.
// llama_ref_a: the shipped Llama reference (L4 H4 KV2 d64 F176 T16 V97 B4).
// llama_ref_h6_kv3_v101: make_reference_llama.py --heads 6 --kv-heads 3 --dim 96 --ffn 120
// --vocab 101 --batch 6 --layers 3 --seed 77. llama_ref_mqa_v61: --heads 4 --kv-heads 1
// --dim 64 --ffn 96 --vocab 61 --layers 2 --steps 4 --theta 500000 --seed 5 (multi-query,
// Llama 3's rotary base).
INSTANTIATE_TEST_SUITE_P(References, ReferenceTest,
                         ::testing::Values(ReferenceCase{"gpt2_ref_a.h5", 0}, ReferenceCase{"gpt2_ref_a.h5", 1},
                                           ReferenceCase{"gpt2_ref_a.h5", 2}, ReferenceCase{"gpt2_ref_h6_v101.h5", 0},
                                           ReferenceCase{"gpt2_ref_h6_v101.h5", 3},
                                           ReferenceCase{"gpt2_ref_h3_v61.h5", 0}, ReferenceCase{"llama_ref_a.h5", 0},
                                           ReferenceCase{"llama_ref_a.h5", 1},
                                           ReferenceCase{"llama_ref_h6_kv3_v101.h5", 0},
                                           ReferenceCase{"llama_ref_h6_kv3_v101.h5", 2},
                                           ReferenceCase{"llama_ref_mqa_v61.h5", 0}),
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

TEST(ReferenceTest, AReferenceOfAnUnknownFamilyIsNamed) {
  const std::string path = testing::TempDir() + "trident_mamba_reference.h5";
  {
    Hdf5Writer file(path);
    file.attr("/", "format", std::string("trident-reference-v1"));
    file.attr("/", "model", std::string("mamba"));
    for (const char* key : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) file.attr("/", key, int64_t{4});
    file.attr("/", "layernorm_eps", 1e-5);
    file.close();
  }
  try {
    load_reference(path);
    FAIL() << "loaded a reference of an unknown family";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.family must be gpt2, llama, mistral, mixtral, olmo2, qwen2, qwen3 or qwen3_moe, got 'mamba'"), std::string::npos) << e.what();
  }
}

TEST(ReferenceTest, LlamaDetectsAWrongModel) {
  // A rotary base off by 1% changes every attention score: the gradients must fail.
  Reference ref = load_reference("tests/data/llama_ref_a.h5");
  ref.model.rope_theta *= 1.01;
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  const VerifyReport r = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
  EXPECT_GT(r.max_gradient_error(), VerifyReport::kGradientTolerance);
  EXPECT_FALSE(r.passed());
}

// What makes each Llama-style family itself is checked: the same reference run without it
// (Qwen2's biases, Qwen3's head norms, Mistral's window) fails.
TEST(ReferenceTest, EachFamilysOwnPartIsChecked) {
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  for (const std::string family : {"qwen2", "qwen3", "mistral"}) {
    Reference ref = load_reference(family == "mistral" ? "tests/data/mistral_ref_w7.h5"
                                                       : "tests/data/" + family + "_ref_t24.h5");
    EXPECT_EQ(ref.model.family, family);
    EXPECT_TRUE(verify_against_reference(ref, 0, *k, parallel, ParallelConfig{}).passed()) << family;
    if (family == "mistral") {
      EXPECT_EQ(ref.model.sliding_window, 7);
      ref.model.sliding_window = 0;
    } else {
      ref.model.family = "llama";  // the same tensors but the biases or the head norms
    }
    EXPECT_FALSE(verify_against_reference(ref, 0, *k, parallel, ParallelConfig{}).passed()) << family;
  }
}

// OLMo-2 (tests/data/olmo2_ref_t24.h5): post-norm branches (no norm before attention or
// the MLP, post_attention_layernorm and post_feedforward_layernorm after them) and q and k
// RMS-normalized over their whole projection. Verify passes it on one rank; its q/k norms
// are the whole width's, so the same tensors read as Qwen3's per-head norms do not fit.
TEST(ReferenceTest, Olmo2PostNormBranchesAndWholeWidthQkNorms) {
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  Reference ref = load_reference("tests/data/olmo2_ref_t24.h5");
  EXPECT_EQ(ref.model.family, "olmo2");
  const VerifyReport report = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
  EXPECT_TRUE(report.passed());
  EXPECT_LT(report.max_gradient_error(), VerifyReport::kGradientTolerance);
  ref.model.family = "qwen3";
  EXPECT_THROW(verify_against_reference(ref, 0, *k, parallel, ParallelConfig{}), UsageError);
}

// A Llama-style model whose heads have their own width (model.head_dim 16, not d_model 32 /
// 4 heads) and whose head reads the token table (model.tie_word_embeddings): the
// reference's attributes say so, verify passes it, and the same tensors read with the
// heads d_model / n_head wide do not fit.
TEST(ReferenceTest, HeadsOfTheirOwnWidthAndATiedHead) {
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  Reference ref = load_reference("tests/data/qwen3_ref_hd16_tied.h5");
  EXPECT_EQ(ref.model.head_dim, 16);
  EXPECT_TRUE(ref.model.tie_word_embeddings);
  EXPECT_TRUE(verify_against_reference(ref, 0, *k, parallel, ParallelConfig{}).passed());
  ref.model.head_dim = 0;
  EXPECT_THROW(verify_against_reference(ref, 0, *k, parallel, ParallelConfig{}), UsageError);
}

// Each option of a mixture of experts is checked: verify with the option flipped fails on
// the reference made without the flip (the score function, the top-k renormalization,
// the capacity factor, the drop policy, the auxiliary and z-loss coefficients), and the
// checks that see it are named: the gradients for every option that changes which
// experts a token's output takes or how much (the step-0 loss alone moves by less than
// its tolerance for the score function); the auxiliary loss for its coefficients.
TEST(ReferenceTest, EachMixtureOfExpertsOptionIsChecked) {
  auto k = kernels::make_cpu_kernels();
  ParallelState parallel(ParallelDims{}, 0, 60);
  struct Flip {
    std::string file, what;
    std::function<void(ModelConfig&)> flip;
  };
  const std::vector<Flip> flips = {
      {"mixtral_ref_e4.h5", "sigmoid scores", [](ModelConfig& m) { m.moe_router_score = "sigmoid"; }},
      {"mixtral_ref_sigmoid.h5", "softmax scores", [](ModelConfig& m) { m.moe_router_score = "softmax"; }},
      {"qwen3_moe_ref_position.h5", "top-k renormalized", [](ModelConfig& m) { m.moe_norm_topk = true; }},
      {"qwen3_moe_ref_e8.h5", "top-k renormalized", [](ModelConfig& m) { m.moe_norm_topk = true; }},
      {"mixtral_ref_e4.h5", "a capacity factor of 1", [](ModelConfig& m) { m.moe_capacity_factor = 1.0; }},
      {"mixtral_ref_capacity.h5", "dropless", [](ModelConfig& m) { m.moe_capacity_factor = 0; }},
      {"mixtral_ref_capacity.h5", "a capacity factor of 1.25", [](ModelConfig& m) { m.moe_capacity_factor = 1.25; }},
      {"mixtral_ref_capacity.h5", "the position drop policy", [](ModelConfig& m) { m.moe_token_drop_policy = "position"; }},
      {"qwen3_moe_ref_position.h5", "the probs drop policy", [](ModelConfig& m) { m.moe_token_drop_policy = "probs"; }},
      {"mixtral_ref_e4.h5", "no load-balancing loss", [](ModelConfig& m) { m.router_aux_loss_coef = 0; }},
      {"mixtral_ref_e4.h5", "no z-loss", [](ModelConfig& m) { m.router_z_loss_coef = 0; }},
  };
  for (const Flip& f : flips) {
    Reference ref = load_reference("tests/data/" + f.file);
    const VerifyReport as_made = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
    EXPECT_TRUE(as_made.passed()) << f.file;
    f.flip(ref.model);
    const VerifyReport r = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
    std::printf("%-28s %-28s loss %.2e grads %.2e params %.2e aux %.2e dropped %.0f differing %.0f\n", f.file.c_str(),
                f.what.c_str(), r.loss_error, r.max_gradient_error(), r.max_final_param_error(), r.max_aux_loss_error,
                r.tokens_dropped, r.tokens_dropped_differing);
    EXPECT_FALSE(r.passed()) << f.file << " with " << f.what;
    // Not by a hair: each flip moves some gradient by 0.2 relative or more (measured), over
    // 2000 times the tolerance, though the step-0 loss moves by 4e-6 for the score function.
    EXPECT_GT(r.max_gradient_error(), 100 * VerifyReport::kGradientTolerance) << f.file << " with " << f.what;
    if (f.what.find("loss") != std::string::npos) {  // a coefficient: the auxiliary loss itself is off too
      EXPECT_GT(r.max_aux_loss_error, 100 * VerifyReport::kLossTolerance) << f.file << " with " << f.what;
    }
    if (f.what.find("scores") != std::string::npos) {  // the other score function: other choices too
      EXPECT_GT(r.routing_differing, 0) << f.file << " with " << f.what;
      EXPECT_FALSE(r.routing_held()) << f.file << " with " << f.what;
    }
    if (r.tokens_dropped_differing >= 0) {  // a reference that counts its drops: other drops than its
      EXPECT_GT(r.tokens_dropped_differing, 0) << f.file << " with " << f.what;
    }
  }
}

}  // namespace
}  // namespace trident
