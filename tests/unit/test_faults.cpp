// Faults injected into real runs through the executable (issue 17): a non-finite
// gradient on one rank skips the step on every rank under every layout; a streak of them
// goes back to the last checkpoint once, and a second streak ends the run with exit 4
// without writing a checkpoint in the middle of it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_helpers.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

const std::string kRun = "train --config configs/tiny.ini --model.n_layer=2 --log.every_steps=1 "
                         "--log.val_batches=0 --log.peak_gflops=1 --parallel.timeout_s=30 ";

// mpirun that hands rank `rank` a NaN in its reduced gradients at `steps`.
std::string with_nan(int np, int rank, const std::string& steps) {
  return "env TRIDENT_TEST_NAN_RANK=" + std::to_string(rank) + " TRIDENT_TEST_NAN_STEPS=" + steps + " " + kMpirun +
         std::to_string(np) + " -x TRIDENT_TEST_NAN_RANK -x TRIDENT_TEST_NAN_STEPS";
}

std::vector<double> norms(const std::string& out) {
  std::vector<double> result;
  const std::regex line("step +[0-9]+/[0-9]+ \\| loss [^|]+\\| lr [^|]+\\| norm ([^ ]+)");
  for (std::sregex_iterator i(out.begin(), out.end(), line), end; i != end; ++i)
    result.push_back(std::stod((*i)[1]));
  return result;
}

// Without ZeRO every dp rank holds all reduced gradients and computes the norm alone: a
// NaN on one of them must still skip the step everywhere (else the replicas part ways
// and the next collective hangs). With ZeRO, tp and pp the norm itself is global.
TEST(Faults, ANonFiniteGradientOnOneRankSkipsTheStepOnEveryRank) {
  struct Layout {
    int np;
    std::string flags;
  };
  for (const Layout& l : std::vector<Layout>{{2, "--parallel.zero=0"},
                                             {2, "--parallel.zero=1"},
                                             {2, "--parallel.zero=2"},
                                             {2, "--parallel.tp=2"},
                                             {2, "--parallel.pp=2 --train.micro_batch=4"},
                                             {4, "--parallel.tp=2 --parallel.pp=2 --train.micro_batch=8"}}) {
    const CliRun r = run(kRun + "--train.steps=6 " + l.flags + " --log.run_dir=" + testing::TempDir() + "faults_skip",
                         with_nan(l.np, l.np - 1, "3"), 120);
    const std::string what = "-np " + std::to_string(l.np) + " " + l.flags;
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.out << r.err;
    EXPECT_EQ(count(r.out, "update skipped"), 1) << what << "\n" << r.out;
    EXPECT_NE(r.out.find("step 3: non-finite loss"), std::string::npos) << what << "\n" << r.out;
    const std::vector<double> n = norms(r.out);
    ASSERT_EQ(n.size(), 6u) << what << "\n" << r.out;
    for (size_t i = 0; i < n.size(); i++)
      EXPECT_EQ(std::isfinite(n[i]), i != 2) << what << ": step " << i + 1 << " norm " << n[i];  // only step 3
    std::ifstream summary(testing::TempDir() + "faults_skip/summary.json");
    const std::string json((std::istreambuf_iterator<char>(summary)), std::istreambuf_iterator<char>());
    EXPECT_NE(json.find("\"skipped_steps\":1"), std::string::npos) << json;
  }
}

TEST(Faults, AStreakGoesBackToTheLastCheckpointOnceThenTheRunStopsWithExit4) {
  const std::string dir = testing::TempDir() + "faults_ckpt";
  fs::remove_all(dir);
  const auto start = std::chrono::steady_clock::now();
  // Steps 3 on are all non-finite: 3 in a row at step 5 go back to step 2's checkpoint,
  // the same again ends the run. The checkpoint due at step 4 is not written.
  const CliRun r = run(kRun + "--train.steps=8 --train.max_bad_steps=3 --checkpoint.every_steps=2 --checkpoint.dir=" +
                           dir + " --log.run_dir=" + dir + "_run",
                       with_nan(2, 1, "3-100"), 120);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_NE(r.out.find("3 in a row (train.max_bad_steps): going back to the last checkpoint"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resumed from " + dir + "/step_00000002"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint: step 4 not saved"), std::string::npos) << r.out;
  EXPECT_EQ(count(r.err, "trident: diverged:"), 1) << r.err;  // rank 0 says it once
  EXPECT_NE(r.err.find("again after going back to the last checkpoint"), std::string::npos) << r.err;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000002");
  EXPECT_FALSE(fs::exists(dir + "/step_00000004"));

  // No checkpoint to go back to: the first streak ends the run.
  const CliRun none = run(kRun + "--train.steps=6 --train.max_bad_steps=2 --log.run_dir=" + dir + "_none", with_nan(2, 0, "2-100"), 120);
  EXPECT_EQ(none.exit_code, 4) << none.err;
  EXPECT_NE(none.err.find("there is no checkpoint to go back to"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace trident
