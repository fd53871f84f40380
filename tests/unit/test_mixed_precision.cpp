// Mixed precision without a GPU: the bf16 rounding that both backends use, the CPU's
// bf16 emulation (every activation a kernel writes is a bf16 value), fp32 master
// weights behind a bf16 compute copy, the whole model against the float64 reference
// under bf16 tolerances, and the choice of backend at run time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "kernels/base/error.h"
#include "tests/model_shapes.h"
#include "tests/unit/machine.h"
#include "train/verify.h"

namespace trident {
namespace {

using kernels::as_act;
using kernels::bf16_bits_to_float;
using kernels::float_to_bf16_bits;
using kernels::Precision;
using kernels::round_to_bf16;

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f807fffu)), 0x3f80);
  // The largest finite floats round to infinity, as IEEE rounding does.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  // A NaN whose payload sits in the low bits stays a NaN (truncation would make it inf).
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // Subnormals and zero keep their sign.
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(0x1p-130f)), 0x1p-130f);
}

TEST(Bf16, RelativeRoundingErrorIsAtMostTwoToTheMinusEight) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 100000; i++) {
    const float x = normal(rng), r = round_to_bf16(x);
    ASSERT_LE(std::abs(r - x), std::abs(x) * 0x1p-8f) << x;  // 8 significant bits
    ASSERT_EQ(round_to_bf16(r), r);  // idempotent
  }
}

bool all_bf16(const std::vector<float>& v) {
  for (float x : v)
    if (round_to_bf16(x) != x) return false;
  return true;
}

TEST(CpuBf16Emulation, KernelOutputsAreBf16Values) {
  auto k = kernels::make_cpu_kernels(Precision::bf16);
  EXPECT_EQ(k->precision(), Precision::bf16);
  EXPECT_EQ(k->activation_type(), kernels::DType::f32);  // bf16 values in float storage
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int N = 16, C = 32, OC = 48;
  std::vector<float> inp(N * C), weight(OC * C), bias(OC), out(N * OC), gelu(N * OC), ln(N * C), mean(N), rstd(N);
  for (auto* v : {&inp, &weight, &bias})
    for (float& x : *v) x = round_to_bf16(normal(rng));
  k->matmul_forward(as_act(out.data()), as_act(inp.data()), as_act(weight.data()), as_act(bias.data()), N, C, OC);
  EXPECT_TRUE(all_bf16(out));
  k->gelu_forward(as_act(gelu.data()), as_act(out.data()), gelu.size());
  EXPECT_TRUE(all_bf16(gelu));
  k->layernorm_forward(as_act(ln.data()), mean.data(), rstd.data(), as_act(inp.data()), as_act(weight.data()),
                       as_act(bias.data()), N, C, 1e-5f);
  EXPECT_TRUE(all_bf16(ln));
  EXPECT_FALSE(all_bf16(rstd));  // statistics stay fp32
  // The same kernel in fp32 writes values that are not all bf16.
  auto fp32 = kernels::make_cpu_kernels(Precision::fp32);
  fp32->matmul_forward(as_act(out.data()), as_act(inp.data()), as_act(weight.data()), as_act(bias.data()), N, C, OC);
  EXPECT_FALSE(all_bf16(out));
}

ModelConfig small_model() { return gpt2_shape(2, 2, 32, 16, 64); }

TEST(MixedPrecision, MasterWeightsKeepUpdatesSmallerThanBf16Resolution) {
  auto k = kernels::make_cpu_kernels(Precision::bf16);
  Transformer model(small_model(), *k, {.micro_batch = 2});
  EXPECT_GT(model.store().compute_weight_bytes(), 0u);  // a separate compute copy
  model.init_parameters(3);
  const size_t n = model.layout().total_floats();
  for (size_t i = 0; i < n; i++) model.store().params()[i] = round_to_bf16(model.store().params()[i]);
  model.store().parameters_changed();
  std::vector<int32_t> tokens(2 * 16), targets(2 * 16);
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>((i * 7) % 64);
    targets[i] = static_cast<int32_t>((i * 5 + 3) % 64);
  }
  const float before = model.forward(tokens.data(), targets.data(), 2);
  // A step of 2^-12 relative: the fp32 master moves, its bf16 copy (resolution 2^-8 to
  // 2^-7 relative) does not, so the loss is bit-identical ...
  for (size_t i = 0; i < n; i++) model.store().params()[i] *= 1.0f + 0x1p-12f;
  model.store().parameters_changed();
  EXPECT_EQ(model.forward(tokens.data(), targets.data(), 2), before);
  EXPECT_FALSE(all_bf16(std::vector<float>(model.store().params(), model.store().params() + n)));
  // ... and 31 more such steps add up in the master until the copy moves too.
  for (int step = 0; step < 31; step++)
    for (size_t i = 0; i < n; i++) model.store().params()[i] *= 1.0f + 0x1p-12f;
  model.store().parameters_changed();
  EXPECT_NE(model.forward(tokens.data(), targets.data(), 2), before);
}

TEST(MixedPrecision, Fp32ComputeReadsTheParametersThemselves) {
  auto k = kernels::make_cpu_kernels(Precision::fp32);
  Transformer model(small_model(), *k);
  EXPECT_EQ(model.store().compute_weight_bytes(), 0u);
}

// On this CPU's bf16 GEMMs (oneDNN) where it has them, else emulated; tests/run_tests.sh runs
// it again with DNNL_MAX_CPU_ISA=AVX512_CORE, where it checks that the emulation ran.
TEST(MixedPrecision, Bf16ModelMatchesTheReferenceWithinBf16Tolerances) {
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  const bool capped = isa != nullptr && std::string(isa) == "AVX512_CORE";
  for (const char* file : {"tests/data/gpt2_ref_a.h5", "tests/data/llama_ref_a.h5", "tests/data/qwen2_ref_t24.h5"}) {
    const Reference ref = load_reference(file);
    auto k = kernels::make_cpu_kernels(Precision::bf16);
    if (capped) {
      EXPECT_EQ(k->name(), "cpu (bf16 emulated)");
    }
    ParallelState parallel(ParallelDims{}, 0, 60);
    const VerifyReport r = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
    EXPECT_EQ(r.tolerance.gradient, VerifyReport::kBf16GradientTolerance);
    EXPECT_TRUE(r.passed()) << file << ": loss " << r.loss_error << " grads " << r.max_gradient_error() << " params "
                            << r.max_final_param_error() << " key biases " << r.max_key_bias_param_error();
    // Really rounded: the errors are those of bf16, far above a float32 run's.
    EXPECT_GT(r.max_gradient_error(), VerifyReport::kGradientTolerance) << file;
    EXPECT_LT(r.max_gradient_error(), 2e-2) << file;
    EXPECT_LT(r.loss_error, 1e-3) << file;
    EXPECT_GT(r.max_final_param_error(), VerifyReport::kParamTolerance) << file;
    // The key biases (GPT-2's c_attn.bias, Qwen2's k_proj.bias) alone take the looser
    // bound: AdamW moves them on rounding noise (verify.h), further than any other tensor.
    if (ref.model.family == "llama") {
      EXPECT_LT(r.max_key_bias_param_error(), 0) << "Llama has no key biases";
    } else {
      EXPECT_GT(r.max_key_bias_param_error(), 2 * r.max_final_param_error()) << file;
    }
  }
}

// The bf16 bound on the final parameters catches an update a fifth too large, which the
// key biases' bound (0.25, once every tensor's) did not.
TEST(MixedPrecision, Bf16ToleranceCatchesAnUpdateAFifthTooLarge) {
  Reference ref = load_reference("tests/data/llama_ref_a.h5");
  ref.lr *= 1.2;
  auto k = kernels::make_cpu_kernels(Precision::bf16);
  ParallelState parallel(ParallelDims{}, 0, 60);
  const VerifyReport r = verify_against_reference(ref, 0, *k, parallel, ParallelConfig{});
  EXPECT_LT(r.max_gradient_error(), VerifyReport::kBf16GradientTolerance);  // step 0's gradients are unchanged
  EXPECT_GT(r.max_final_param_error(), VerifyReport::kBf16ParamTolerance);
  EXPECT_LT(r.max_final_param_error(), VerifyReport::kBf16KeyBiasParamTolerance);
  EXPECT_FALSE(r.passed());
}

// The linear layers' GEMMs in real bf16 (kernels/cpu/bf16_gemm.h) on bf16 values: the fp32
// GEMM's result but for the order of the fp32 additions, in every transpose and for both
// betas, with leading dimensions wider than the rows, and nothing done without rows or depth.
TEST(CpuBf16Gemm, IsTheFp32GemmOnBf16Values) {
  if (kernels::cpu::bf16_gemm_isa().empty()) GTEST_SKIP() << "this CPU has no bf16 GEMM instructions (oneDNN)";
  kernels::cpu::Bf16Gemm bf16;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int M = 37, N = 53, K = 71, pad = 5;
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const int lda = (trans_a ? M : K) + pad, ldb = (trans_b ? K : N) + pad, ldc = N + pad;
        std::vector<float> A(size_t(trans_a ? K : M) * lda), B(size_t(trans_b ? N : K) * ldb), C(size_t(M) * ldc);
        for (auto* v : {&A, &B, &C})
          for (float& x : *v) x = round_to_bf16(normal(rng));
        std::vector<float> expected = C, got = C;
        double largest_term_sum = 0;
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double sum = beta * C[size_t(i) * ldc + j], magnitude = std::abs(sum);
            for (int k = 0; k < K; k++) {
              const double a = trans_a ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
              const double b = trans_b ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
              sum += a * b;
              magnitude += std::abs(a * b);
            }
            expected[size_t(i) * ldc + j] = static_cast<float>(sum);
            largest_term_sum = std::max(largest_term_sum, magnitude);
          }
        bf16.gemm(trans_a, trans_b, M, N, K, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
        double worst = 0;
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++)
            worst = std::max(worst, std::abs(double(got[size_t(i) * ldc + j]) - expected[size_t(i) * ldc + j]));
        // fp32 accumulation: K additions of 2^-24 relative error each, at most.
        EXPECT_LE(worst, K * std::ldexp(1.0, -24) * largest_term_sum)
            << "trans_a " << trans_a << " trans_b " << trans_b << " beta " << beta;
        for (int i = 0; i < M; i++)  // the padding between rows is left alone
          for (int j = N; j < ldc; j++) EXPECT_EQ(got[size_t(i) * ldc + j], C[size_t(i) * ldc + j]);
      }
  std::vector<float> c = {1.0f, 2.0f};
  bf16.gemm(false, true, 1, 2, 0, nullptr, 1, nullptr, 1, 1.0f, c.data(), 2);  // no depth: C stays
  EXPECT_EQ(c, (std::vector<float>{1.0f, 2.0f}));
  bf16.gemm(false, true, 1, 2, 0, nullptr, 1, nullptr, 1, 0.0f, c.data(), 2);  // beta 0: C = 0
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f}));
  // The backend says which GEMMs it runs.
  EXPECT_NE(kernels::make_cpu_kernels(Precision::bf16)->name().find("GEMMs in bf16 on avx512_core_"), std::string::npos);
}

// MFU's denominator on the CPU (plan/device_peak.h) is the rate of the GEMM the linear layers
// run: sgemm in fp32, the bf16 GEMM under bf16 where the CPU has bf16 instructions (read
// from /proc/cpuinfo here, from oneDNN's probe there), measured: well above sgemm's (about
// 2x with AVX-512 BF16, 3x with AMX; alternated, the best of 3, against a noisy machine).
TEST(CpuBf16Gemm, MfuPeakIsTheGemmOfThePrecision) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string flags((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
  const bool capped = std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr || std::getenv("DNNL_MAX_CPU_ISA") != nullptr;
  const bool instructions = flags.find(" avx512_bf16") != std::string::npos && !capped;
  const auto fp32 = kernels::make_cpu_kernels(Precision::fp32), bf16 = kernels::make_cpu_kernels(Precision::bf16);
  EXPECT_EQ(fp32->measured_gemm(), "sgemm");
  if (!instructions) {
    EXPECT_EQ(bf16->measured_gemm(), "sgemm");  // emulated: its GEMMs are fp32's
    return;
  }
  EXPECT_EQ(bf16->measured_gemm(), "bf16 GEMM (oneDNN on " + kernels::cpu::bf16_gemm_isa() + ")");
  double fp32_rate = 0, bf16_rate = 0;
  for (int i = 0; i < 3; i++) {
    fp32_rate = std::max(fp32_rate, fp32->measure_gemm_gflops(512, 0.05));
    bf16_rate = std::max(bf16_rate, bf16->measure_gemm_gflops(512, 0.05));
  }
  EXPECT_GT(bf16_rate, 1.3 * fp32_rate) << "bf16 " << bf16_rate << " GFLOP/s, sgemm " << fp32_rate;
  std::printf("GEMM 512^3: sgemm %.1f GFLOP/s, %s %.1f\n", fp32_rate, bf16->measured_gemm().c_str(), bf16_rate);
}

// Through the backend (make_cpu_kernels(bf16), which picks bf16 GEMMs on this CPU): a
// linear layer's forward and both halves of its backward are the fp32 kernels' on the same
// bf16 values, and a second backward on new values in the same memory sees the new values
// (what one op converted is not reused by the next).
TEST(CpuBf16Gemm, LinearLayerThroughTheBackendIsTheFp32KernelsOnBf16Values) {
  if (kernels::cpu::bf16_gemm_isa().empty()) GTEST_SKIP() << "this CPU has no bf16 GEMM instructions (oneDNN)";
  auto bf16 = kernels::make_cpu_kernels(Precision::bf16), fp32 = kernels::make_cpu_kernels(Precision::fp32);
  const int N = 33, C = 40, OC = 56;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> inp(N * C), weight(OC * C), bias(OC), dout(N * OC);
  const auto fill = [&](std::vector<float>& v) {
    for (float& x : v) x = round_to_bf16(normal(rng));
  };
  for (auto* v : {&inp, &weight, &bias, &dout}) fill(*v);
  const auto near = [](const std::vector<float>& got, const std::vector<float>& want, double relative) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++)
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (std::abs(double(want[i])) + 1e-3));
    return worst <= relative;
  };
  std::vector<float> out_b(N * OC), out_f(N * OC);
  bf16->matmul_forward(as_act(out_b.data()), as_act(inp.data()), as_act(weight.data()), as_act(bias.data()), N, C, OC);
  fp32->matmul_forward(as_act(out_f.data()), as_act(inp.data()), as_act(weight.data()), as_act(bias.data()), N, C, OC);
  for (float& x : out_f) x = round_to_bf16(x);  // what the bf16 backend stores
  EXPECT_TRUE(near(out_b, out_f, std::ldexp(1.0, -7)));  // one bf16 step at most, from the order of additions
  for (int round = 0; round < 2; round++) {
    if (round == 1) fill(dout);  // new values, same memory
    std::vector<float> dinp_b(N * C), dinp_f(N * C), dweight_b(OC * C, 0.0f), dweight_f(OC * C, 0.0f);
    bf16->matmul_backward(as_act(dinp_b.data()), dweight_b.data(), nullptr, as_act(dout.data()), as_act(inp.data()),
                          as_act(weight.data()), N, C, OC);
    fp32->matmul_backward(as_act(dinp_f.data()), dweight_f.data(), nullptr, as_act(dout.data()), as_act(inp.data()),
                          as_act(weight.data()), N, C, OC);
    for (float& x : dinp_f) x = round_to_bf16(x);
    EXPECT_TRUE(near(dinp_b, dinp_f, std::ldexp(1.0, -7))) << "round " << round;
    EXPECT_TRUE(near(dweight_b, dweight_f, 1e-4)) << "round " << round;  // fp32 gradients, fp32 sums
  }
}

TEST(Dispatch, PicksTheBackendByName) {
  EXPECT_EQ(kernels::make_kernels(Device::cpu, Precision::fp32)->name(), "cpu");
  EXPECT_EQ(kernels::make_kernels(Device::cpu, Precision::bf16)->precision(), Precision::bf16);
  EXPECT_THROW(parse_choice<Device>("tpu"), UsageError);  // the config reads the device by name
  EXPECT_EQ(kernels::parse_precision("bf16"), Precision::bf16);
  EXPECT_THROW(kernels::parse_precision("fp16"), UsageError);
  // Without a GPU, asking for CUDA is bad input, not a crash; with one, it is a backend.
  if (test::machine_has_gpu()) EXPECT_EQ(kernels::make_kernels(Device::cuda, Precision::bf16)->precision(), Precision::bf16);
  else EXPECT_THROW(kernels::make_kernels(Device::cuda, Precision::bf16), UsageError);
}

}  // namespace
}  // namespace trident
