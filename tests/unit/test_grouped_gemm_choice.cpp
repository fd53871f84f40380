// kernels/grouped_gemm_choice.h without a GPU: how the CUDA backend picks grouped or
// per-expert GEMMs for a mixture's experts (TRIDENT_GROUPED_GEMM, kernel_check's record),
// and that cuBLAS's "not supported" turns grouped off once, said once. Also the staging
// sizes that keep a mixture's uploads from growing pinned memory mid-run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/base/error.h"
#include "kernels/cuda/cuda_sizes.h"
#include "kernels/grouped_gemm_choice.h"
#include "kernels/kernels.h"
#include "model/layers/moe.h"

namespace trident::kernels {
namespace {

const std::string kH100 = "NVIDIA H100 80GB HBM3";

struct Logged {
  std::vector<std::string> lines;
  GroupedGemmChoice::Log log() {
    return [this](const std::string& line) { lines.push_back(line); };
  }
};

TEST(GroupedGemmChoice, ParsesTheSetting) {
  EXPECT_EQ(parse_grouped_gemm_setting(nullptr), GroupedGemmSetting::automatic);
  EXPECT_EQ(parse_grouped_gemm_setting(""), GroupedGemmSetting::automatic);
  EXPECT_EQ(parse_grouped_gemm_setting("auto"), GroupedGemmSetting::automatic);
  EXPECT_EQ(parse_grouped_gemm_setting("grouped"), GroupedGemmSetting::grouped);
  EXPECT_EQ(parse_grouped_gemm_setting("per_expert"), GroupedGemmSetting::per_expert);
  try {
    parse_grouped_gemm_setting("per-expert");
    FAIL() << "a bad value was taken";
  } catch (const UsageError& e) {  // exit 2, one message naming what is allowed
    const std::string what = e.what();
    EXPECT_NE(what.find("TRIDENT_GROUPED_GEMM=per-expert"), std::string::npos) << what;
    EXPECT_NE(what.find("auto, grouped or per_expert"), std::string::npos) << what;
  }
}

TEST(GroupedGemmChoice, AutoIsGroupedWithoutAMeasurement) {
  Logged logged;
  GroupedGemmChoice choice(GroupedGemmSetting::automatic, std::nullopt, kH100, logged.log());
  EXPECT_TRUE(choice.use_grouped(true));
  EXPECT_NE(choice.description().find("no measurement"), std::string::npos) << choice.description();
  EXPECT_TRUE(logged.lines.empty());
}

TEST(GroupedGemmChoice, AutoFollowsARecordWherePerExpertWins) {
  const std::string path = testing::TempDir() + "trident_gpu_choices.json";
  std::remove(path.c_str());
  EXPECT_FALSE(read_grouped_gemm_record(path, Precision::bf16));  // no file: no record
  record_grouped_gemm(path, Precision::bf16, {kH100, 3.5, 2.5, true});
  record_grouped_gemm(path, Precision::fp32, {kH100, 7.0, 9.0, true});  // kept beside bf16's
  const auto bf16 = read_grouped_gemm_record(path, Precision::bf16);
  ASSERT_TRUE(bf16);
  EXPECT_EQ(bf16->device, kH100);
  EXPECT_DOUBLE_EQ(bf16->grouped_ms, 3.5);
  EXPECT_DOUBLE_EQ(bf16->per_expert_ms, 2.5);

  Logged logged;
  GroupedGemmChoice choice(GroupedGemmSetting::automatic, bf16, kH100, logged.log());
  EXPECT_FALSE(choice.use_grouped(true));
  EXPECT_FALSE(choice.on());
  EXPECT_NE(choice.description().find("per expert (auto, measured"), std::string::npos) << choice.description();
  GroupedGemmChoice fp32(GroupedGemmSetting::automatic, read_grouped_gemm_record(path, Precision::fp32), kH100,
                         logged.log());
  EXPECT_TRUE(fp32.use_grouped(true));
  // Measured on another GPU: not this one's answer.
  GroupedGemmChoice other(GroupedGemmSetting::automatic, bf16, "NVIDIA A100-SXM4-80GB", logged.log());
  EXPECT_TRUE(other.use_grouped(true));
  EXPECT_NE(other.description().find("not NVIDIA A100"), std::string::npos) << other.description();
  // The environment's setting wins over the record.
  GroupedGemmChoice forced(GroupedGemmSetting::grouped, bf16, kH100, logged.log());
  EXPECT_TRUE(forced.use_grouped(true));
  EXPECT_TRUE(logged.lines.empty());

  // From the environment: TRIDENT_GPU_CHOICES names the record.
  setenv("TRIDENT_GPU_CHOICES", path.c_str(), 1);
  unsetenv("TRIDENT_GROUPED_GEMM");
  EXPECT_FALSE(GroupedGemmChoice::from_environment(kH100, Precision::bf16, nullptr).on());
  setenv("TRIDENT_GROUPED_GEMM", "grouped", 1);
  EXPECT_TRUE(GroupedGemmChoice::from_environment(kH100, Precision::bf16, nullptr).on());
  setenv("TRIDENT_GROUPED_GEMM", "fastest", 1);
  EXPECT_THROW(GroupedGemmChoice::from_environment(kH100, Precision::bf16, nullptr), UsageError);
  unsetenv("TRIDENT_GROUPED_GEMM");
  std::ofstream(path) << "{ not json";
  EXPECT_THROW(GroupedGemmChoice::from_environment(kH100, Precision::bf16, nullptr), UsageError);
  unsetenv("TRIDENT_GPU_CHOICES");
  std::remove(path.c_str());
}

TEST(GroupedGemmChoice, AGroupedRowThatRanPerExpertNeverWins) {
  EXPECT_FALSE((GroupedGemmMeasurement{kH100, 1.0, 2.0, false}.grouped_wins()));
  EXPECT_TRUE((GroupedGemmMeasurement{kH100, 1.0, 2.0, true}.grouped_wins()));
}

TEST(GroupedGemmChoice, NotSupportedTurnsItOffOnceAndSaysSoOnce) {
  Logged logged;
  GroupedGemmChoice choice(GroupedGemmSetting::automatic, std::nullopt, kH100, logged.log());
  ASSERT_TRUE(choice.use_grouped(true));
  for (int call = 0; call < 5; call++) choice.not_supported();  // every expert GEMM of a step
  EXPECT_FALSE(choice.use_grouped(true));
  EXPECT_TRUE(choice.grouped_off());
  ASSERT_EQ(logged.lines.size(), 1u);
  EXPECT_NE(logged.lines[0].find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << logged.lines[0];
  EXPECT_NE(choice.description().find("per expert"), std::string::npos);
  // kernel_check times the grouped way after an odd shape turned it off: set() clears it.
  choice.set(GroupedGemmSetting::grouped);
  EXPECT_TRUE(choice.use_grouped(true));
  EXPECT_FALSE(choice.grouped_off());
}

TEST(GroupedGemmChoice, AMissingEntryPointIsGroupedUnavailableSaidOnce) {
  Logged logged;
  GroupedGemmChoice choice(GroupedGemmSetting::grouped, std::nullopt, kH100, logged.log());
  for (int call = 0; call < 3; call++) EXPECT_FALSE(choice.use_grouped(false));
  ASSERT_EQ(logged.lines.size(), 1u);
  EXPECT_NE(logged.lines[0].find("cublasGemmGroupedBatchedEx"), std::string::npos) << logged.lines[0];
  // Chosen per expert, cuBLAS is not even asked: nothing to say.
  Logged quiet;
  GroupedGemmChoice per_expert(GroupedGemmSetting::per_expert, std::nullopt, kH100, quiet.log());
  EXPECT_FALSE(per_expert.use_grouped(false));
  EXPECT_TRUE(quiet.lines.empty());
}

// The pinned staging covers what a mixture uploads in a step: its rows permutation (N K
// ints) and, under expert parallelism, the order of up to N K ep rows received; with the
// backend's own index (3N + 2 ints) and grouped pointer arrays.
TEST(UploadStaging, CoversAMixturesUploads) {
  for (const auto& [N, K, ep] : std::vector<std::tuple<size_t, int, int>>{{16384, 8, 1}, {16384, 8, 8}, {4096, 2, 4},
                                                                         {8, 1, 1}}) {
    const size_t reserved = std::max(cuda_sizes::own_upload_bytes(static_cast<int>(N)),
                                     std::max(N * sizeof(int32_t), moe_largest_upload_bytes(N, K, ep)));
    EXPECT_GE(reserved, N * K * sizeof(int32_t)) << "rows permutation, N " << N << " K " << K;
    EXPECT_GE(reserved, N * K * ep * sizeof(int32_t)) << "ep order, N " << N << " K " << K << " ep " << ep;
    EXPECT_GE(reserved, (3 * N + 2) * sizeof(int32_t)) << "embedding index, N " << N;
    EXPECT_GE(reserved, 3 * cuda_sizes::kMaxGroupedProblems * sizeof(void*));
  }
}

// Kernels::upload() counts what exceeds reserve_uploads(), on any backend.
TEST(UploadStaging, CountsUploadsBeyondTheReserve) {
  auto k = make_cpu_kernels();
  std::vector<int32_t> host(100, 7);
  void* device = k->alloc(host.size() * sizeof(int32_t));
  k->reserve_uploads(50 * sizeof(int32_t));
  k->upload(device, host.data(), 50 * sizeof(int32_t));
  EXPECT_EQ(k->uploads_beyond_reserve(), 0u);
  k->upload(device, host.data(), 100 * sizeof(int32_t));
  EXPECT_EQ(k->uploads_beyond_reserve(), 1u);
  k->reserve_uploads(10);  // never shrinks
  k->upload(device, host.data(), 50 * sizeof(int32_t));
  EXPECT_EQ(k->uploads_beyond_reserve(), 1u);
  k->free(device);
}

}  // namespace
}  // namespace trident::kernels
