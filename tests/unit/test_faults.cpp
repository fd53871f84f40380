// Faults injected into real runs through the executable (issue 17): a non-finite
// gradient on one rank skips the step on every rank under every layout; a streak of them
// goes back to the last checkpoint once, and a second streak ends the run with exit 4
// without writing a checkpoint in the middle of it; a stopped rank is named by the ranks
// that time out waiting for it, and its node is named for the batch script (health/); a
// straggler that stays one and a replica whose parameters differ (one bit flipped) end
// the run naming theirs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <signal.h>
#include <sys/statvfs.h>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "child_process.h"
#include "ckpt/checkpoint.h"
#include "cli_helpers.h"
#include "health/health_verdict.h"
#include "train/goodput.h"
#include "train/host_faults.h"

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
  // The steps trained again after going back are logged once: metrics.jsonl was cut back
  // (a streak's last step, where the run goes back or stops, is not logged).
  std::ifstream log(dir + "_run/metrics.jsonl");
  std::vector<int> logged;
  const std::regex step_of("\"step\":([0-9]+)");
  for (std::string line; std::getline(log, line);) {
    std::smatch m;
    if (line.find("\"loss\"") != std::string::npos && std::regex_search(line, m, step_of)) logged.push_back(std::stoi(m[1]));
  }
  EXPECT_EQ(logged, (std::vector<int>{1, 2, 3, 4})) << slurp(dir + "_run/metrics.jsonl");

  // No checkpoint to go back to: the first streak ends the run.
  const CliRun none = run(kRun + "--train.steps=6 --train.max_bad_steps=2 --log.run_dir=" + dir + "_none", with_nan(2, 0, "2-100"), 120);
  EXPECT_EQ(none.exit_code, 4) << none.err;
  EXPECT_NE(none.err.find("there is no checkpoint to go back to"), std::string::npos) << none.err;
}

// A rank stopped with SIGSTOP (no thread of it runs: it cannot answer anything): the
// others' waits time out and name it from the machine's progress board, the job ends
// within the timeout plus 15 s with exit 3. 8 ranks as (dp, tp) = (4, 2): rank 5 is tp
// rank 1 of dp rank 2; its tp partner and its dp group wait on it in collectives.
TEST(Faults, AStoppedRankIsNamedByTheRanksWaitingForIt) {
  const int timeout_s = 5;
  const auto start = std::chrono::steady_clock::now();
  const std::string base = kRun.substr(0, kRun.find("--parallel.timeout_s"));
  const std::string dir = testing::TempDir() + "stopped_ckpt";
  fs::remove_all(dir);
  const CliRun r = run(base + "--model.d_model=64 --model.n_head=4 --train.steps=6 --parallel.tp=2 --log.run_dir=" +
                           testing::TempDir() + "stopped --parallel.timeout_s=" + std::to_string(timeout_s) +
                           " --checkpoint.dir=" + dir,
                       "env TRIDENT_TEST_STALL_RANK=5 TRIDENT_TEST_STALL_STEP=3 TRIDENT_TEST_STALL_SIGNAL=STOP " + kMpirun +
                           "8 -x TRIDENT_TEST_STALL_RANK -x TRIDENT_TEST_STALL_STEP -x TRIDENT_TEST_STALL_SIGNAL",
                       120);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_LT(elapsed, timeout_s + 15.0 + 10.0) << "start-up of 8 ranks included";
  std::printf("fault: rank 5 of 8 stopped at step 3: job ended with exit %d, %.1f s after its start (timeout %d s)\n",
              r.exit_code, elapsed, timeout_s);
  EXPECT_NE(r.err.find("rank 5: TRIDENT_TEST_STALL_RANK set: stalling at step 3 (SIGSTOP)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("timeout: "), std::string::npos) << r.err;
  // Whoever timed out first names rank 5 as the member that had not started the operation.
  const std::regex named("ranks that had not started this [a-z_]+ \\(#[0-9]+ on the group\\): 5 \\(");
  EXPECT_TRUE(std::regex_search(r.err, named)) << r.err;
  // The verdict for the batch script: rank 5's node, not rank 4's (its tp partner, which
  // the dp group waited for too, but which was itself waiting on rank 5).
  const std::string verdict = health::verdict_path(dir);
  ASSERT_TRUE(fs::exists(verdict)) << r.err;
  const health::Verdict v = health::from_json(slurp(verdict));
  EXPECT_EQ(v.host, health::node_name());
  EXPECT_EQ(v.ranks, std::vector<int>{5}) << slurp(verdict);
  EXPECT_EQ(v.reason.rfind("rank 5 stopped (last seen in step 3): ", 0), 0u) << v.reason;
}

// A rank stopped inside a collective it had started (a SIGSTOP from outside lands there as
// often as not): the board shows it as having started the operation, but its poll loop
// stopped beating, so the rank waiting for it still names it and its node. 2 ranks, dp 2:
// rank 1 stops in the middle of its first wait of step 3.
TEST(Faults, ARankStoppedInsideACollectiveIsNamedToo) {
  const int timeout_s = 4;
  const std::string base = kRun.substr(0, kRun.find("--parallel.timeout_s"));
  const std::string dir = testing::TempDir() + "stopped_inside_ckpt";
  fs::remove_all(dir);
  const CliRun r = run(base + "--train.steps=6 --log.run_dir=" + testing::TempDir() + "stopped_inside --parallel.timeout_s=" +
                           std::to_string(timeout_s) + " --checkpoint.dir=" + dir,
                       "env TRIDENT_TEST_STALL_RANK=1 TRIDENT_TEST_STALL_STEP=3 TRIDENT_TEST_STALL_SIGNAL=STOP_IN_WAIT " +
                           kMpirun + "2 -x TRIDENT_TEST_STALL_RANK -x TRIDENT_TEST_STALL_STEP -x TRIDENT_TEST_STALL_SIGNAL",
                       120);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("rank 1: TRIDENT_TEST_STALL_RANK set: stalling at step 3 (SIGSTOP inside its next wait)"),
            std::string::npos) << r.err;
  // Whether rank 0 timed out in the operation rank 1 stopped in (started it, then silent)
  // or in the next one (rank 1 had not started it, and is no longer beating), or in a
  // receive from it (a point-to-point wait: its other side named), rank 1 is named.
  const std::regex named("(ranks that started this [a-z_]+ \\(#[0-9]+ on the group\\) and then stopped: 1 \\(silent for|"
                         "ranks that had not started this [a-z_]+ \\(#[0-9]+ on the group\\): 1 \\([^)]*\\)(,|$|;|\\n)|"
                         "rank 1 \\(this recv's other side\\) has been silent for [0-9.]+ s: stopped)");
  EXPECT_TRUE(std::regex_search(r.err, named)) << r.err;
  const std::string verdict = health::verdict_path(dir);
  ASSERT_TRUE(fs::exists(verdict)) << r.err;
  const health::Verdict v = health::from_json(slurp(verdict));
  EXPECT_EQ(v.host, health::node_name());
  EXPECT_EQ(v.ranks, std::vector<int>{1}) << slurp(verdict);
  // It stopped inside the step it stalled at (3 from 0: printed as 4), having started its collective there.
  EXPECT_EQ(v.reason.rfind("rank 1 stopped (last seen in step 4): ", 0), 0u) << v.reason;
}

// A rank that dies (kill -9) or hangs (SIGSTOP) while handing its pieces of a checkpoint
// to its node leader: the job ends within the timeout plus 15 s, the rank is named, and
// `latest` still names the previous complete checkpoint (the half-collected one never
// gets a manifest).
TEST(Faults, ARankLostDuringASaveEndsTheJobAndKeepsThePreviousCheckpoint) {
  const int timeout_s = 4;
  const std::string base = kRun.substr(0, kRun.find("--parallel.timeout_s")) +
                           "--train.steps=6 --checkpoint.every_steps=2 --parallel.timeout_s=" + std::to_string(timeout_s);
  struct Case {
    int np;
    std::string fault, named;
  };
  for (const Case& c : {Case{4, "2:4:kill", "rank 2 with PID"}, Case{2, "1:4:stop", "the recv was from rank 1 (rank 1 of the node group)"}}) {
    const std::string dir = testing::TempDir() + "save_fault";
    fs::remove_all(dir);
    const auto start = std::chrono::steady_clock::now();
    const CliRun r = run(base + " --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run",
                         "env TRIDENT_TEST_SAVE_FAULT=" + c.fault + " " + kMpirun + std::to_string(c.np) +
                             " -x TRIDENT_TEST_SAVE_FAULT",
                         120);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.exit_code, 0) << c.fault;
    EXPECT_NE(r.exit_code, 124) << c.fault << ": hung until the test's own limit";
    if (c.fault.ends_with("stop")) {
      EXPECT_EQ(r.exit_code, 3) << r.err;  // trident's timeout: infrastructure
      // The receive's other side, stopped on this machine, is named for the batch script
      // to drain its node (as a stopped rank in a collective is).
      ASSERT_TRUE(fs::exists(health::verdict_path(dir))) << r.err;
      const health::Verdict v = health::from_json(slurp(health::verdict_path(dir)));
      EXPECT_EQ(v.ranks, std::vector<int>{1}) << r.err;
      EXPECT_EQ(v.host, health::node_name());
      EXPECT_NE(v.reason.find("rank 1 stopped (last seen in step 4): recv on the node group waited"), std::string::npos)
          << v.reason;
    }
    EXPECT_LT(elapsed, timeout_s + 15.0 + 5.0) << c.fault << " (start-up included)";
    std::printf("fault: %s (rank:step:how) during a save on %d ranks: exit %d, %.1f s after the job's start (timeout %d s)\n",
                c.fault.c_str(), c.np, r.exit_code, elapsed, timeout_s);
    EXPECT_NE(r.err.find("TRIDENT_TEST_SAVE_FAULT set"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << c.fault << "\n" << r.err;
    std::ifstream latest(dir + "/latest");
    std::string name;
    latest >> name;
    EXPECT_EQ(name, "step_00000002") << c.fault;
    EXPECT_FALSE(fs::exists(dir + "/step_00000004/manifest.json")) << c.fault;
  }
}

// The world ranks of a running mpirun job on this machine and their pids: mpirun's
// children, by the OMPI_COMM_WORLD_RANK in their environment.
std::map<int, int> rank_pids(int mpirun_pid) {
  std::map<int, int> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(slurp(entry.path() / "stat"));
    std::string pid, comm, state;
    int ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != mpirun_pid) continue;
    const std::string environ = slurp(entry.path() / "environ");
    const size_t at = environ.find("OMPI_COMM_WORLD_RANK=");
    if (at != std::string::npos) pids[std::atoi(environ.c_str() + at + 21)] = std::stoi(name);
  }
  return pids;
}

std::map<int, std::string> printed_losses(const std::string& out) {
  std::map<int, std::string> losses;
  const std::regex line("step +([0-9]+)/[0-9]+ \\| loss ([0-9.]+)");
  for (std::sregex_iterator i(out.begin(), out.end(), line), end; i != end; ++i) losses[std::stoi((*i)[1])] = (*i)[2];
  return losses;
}

// kill -9 of a random rank at a random moment of a run that checkpoints every step, 10
// times (the seed is fixed and printed): each job ends within the timeout plus 15 s, and
// the run resumed from the newest complete checkpoint (its files' CRCs checked) prints the
// losses of an uninterrupted run and ends with the same parameters and moments, bit for bit.
TEST(Faults, KilledAtARandomMomentEachRunResumesToTheUninterruptedOne) {
  const int timeout_s = 10, np = 2, steps = 7, trials = 10;
  const std::string args = kRun.substr(0, kRun.find("--parallel.timeout_s")) + "--train.steps=" + std::to_string(steps) +
                           " --checkpoint.every_steps=1 --parallel.timeout_s=" + std::to_string(timeout_s);
  const std::string whole = testing::TempDir() + "kill_whole";
  fs::remove_all(whole);
  const auto started = std::chrono::steady_clock::now();
  const CliRun reference = run(args + " --checkpoint.dir=" + whole + " --log.run_dir=" + whole + "_run", kMpirun + std::to_string(np));
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::map<int, std::string> expected = printed_losses(reference.out);
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps)) << reference.out;
  const std::string final_step = "/step_0000000" + std::to_string(steps);

  // The victims and moments, drawn in order from the seed before any trial runs.
  const uint32_t seed = 20261201;
  std::mt19937 rng(seed);
  std::vector<std::pair<int, double>> draws;
  for (int t = 0; t < trials; t++) {
    const int victim = static_cast<int>(rng() % np);
    // Within the steps (the uninterrupted run's time less its start-up, about half of it here).
    draws.emplace_back(victim, std::uniform_real_distribution<double>(0.0, 0.4 * run_s)(rng));
  }
  std::printf("random kills: seed %u, %d trials, %d ranks, uninterrupted run %.1f s\n", seed, trials, np, run_s);
  std::atomic<int> killed{0};
  const auto trial = [&](int t) {
    const auto [victim, delay_s] = draws[t];
    const std::string dir = testing::TempDir() + "kill_trial" + std::to_string(t);
    fs::remove_all(dir);
    const std::string job = kMpirun + std::to_string(np) + " " + trident_bin() + " " + args + " --checkpoint.dir=" +
                            dir + " --log.run_dir=" + dir + "_run";
    ChildProcess mpirun(job);
    // The random moment counts from the first checkpoint (start-up times vary), however
    // slow: from its line (which the next step's line flushes).
    ASSERT_TRUE(mpirun.wait_for_output("checkpoint: step 1 saved", 120)) << "trial " << t;
    mpirun.run_for(delay_s);
    const std::map<int, int> pids = rank_pids(mpirun.pid());
    const bool hit = pids.count(victim) > 0 && kill(pids.at(victim), SIGKILL) == 0;
    const auto kill_time = std::chrono::steady_clock::now();
    ASSERT_TRUE(mpirun.wait_for_exit(60)) << "trial " << t;
    const double ended_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - kill_time).count();
    EXPECT_LT(ended_s, timeout_s + 15.0) << "trial " << t;
    killed += hit;
    const std::optional<Manifest> latest = find_latest_checkpoint(dir, /*quiet=*/true);
    std::printf("trial %d: rank %d killed %.2f s after the first checkpoint: %s, job gone %.2f s later, newest complete "
                "checkpoint step %d\n", t, victim, delay_s, hit ? "killed" : "already finished", ended_s,
                latest ? latest->step : 0);
    // The last step the killed run completed, as its heartbeat says (at or past its newest checkpoint).
    const std::optional<Heartbeat> beat = read_heartbeat(dir);
    ASSERT_TRUE(beat.has_value()) << "trial " << t;
    // Resumed, bounded as run() is.
    ChildProcess resuming(job);
    ASSERT_TRUE(resuming.wait_for_exit(120)) << "trial " << t;
    const std::string& resumed = resuming.output();
    if (latest && latest->step == steps) {  // the kill came after the run ended: nothing is left to train
      EXPECT_EQ(resuming.exit_code(), 2) << "trial " << t << "\n" << resumed;
      EXPECT_NE(resumed.find("nothing is left to train"), std::string::npos) << "trial " << t << "\n" << resumed;
    } else {
      ASSERT_EQ(resuming.exit_code(), 0) << "trial " << t << "\n" << resumed;
      // Goodput: the restart from the killed run's last step (at least as long as the job
      // took to go after the kill), and the steps past the checkpoint trained again.
      std::smatch m;
      const std::regex restart("restart after step (\\d+): ([0-9.]+) s from its last step to this run's first, (\\d+) step");
      ASSERT_TRUE(std::regex_search(resumed, m, restart)) << "trial " << t << "\n" << resumed;
      EXPECT_EQ(std::stoi(m[1]), beat->step) << "trial " << t;
      EXPECT_GE(std::stod(m[2]), ended_s) << "trial " << t;
      // (A kill between a save and the step's heartbeat leaves the heartbeat one step behind
      // the checkpoint: nothing trained again then.)
      EXPECT_EQ(std::stoi(m[3]), std::max(0, beat->step - (latest ? latest->step : 0))) << "trial " << t;
      EXPECT_NE(resumed.find("goodput "), std::string::npos) << "trial " << t;
    }
    // Every step after the newest complete checkpoint, each at the uninterrupted run's loss.
    const auto losses = printed_losses(resumed);
    EXPECT_EQ(losses.size(), static_cast<size_t>(steps - (latest ? latest->step : 0))) << "trial " << t << "\n" << resumed;
    for (const auto& [step, loss] : losses) EXPECT_EQ(loss, expected.at(step)) << "trial " << t << " step " << step;
    for (const char* kind : {"params", "exp_avg", "exp_avg_sq"}) {
      const auto a = read_canonical(read_manifest(whole + final_step), kind);
      const auto b = read_canonical(read_manifest(dir + final_step), kind);
      ASSERT_FALSE(a.empty()) << kind;
      ASSERT_EQ(a.size(), b.size()) << "trial " << t << " " << kind;
      for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i].second, b[i].second) << "trial " << t << " " << kind << " " << a[i].first;
    }
  };
  // Two trials at a time: most of a trial is waiting (start-up, the launcher's teardown).
  // An exception in the thread would end the whole test binary: it is a failure instead.
  const auto guarded = [&](int t) {
    try {
      trial(t);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << t << ": " << e.what();
    }
  };
  for (int t = 0; t < trials; t += 2) {
    std::thread second(guarded, t + 1);
    guarded(t);
    second.join();
  }
  EXPECT_GE(killed.load(), trials / 2) << "most trials should have killed a rank mid-run";
}

// The memory tier (checkpoint.memory_every_steps = 5, no disk checkpoint before the end): a
// rank killed with kill -9 after step 7; the job resumed in place takes every rank's
// snapshot of step 5 from node memory and prints the uninterrupted run's losses for steps
// 6-12, the steps the killed run had done past 5 counted as trained again (goodput). A
// snapshot with one byte flipped in memory is not used (its
// CRC-32): the run starts again from step 1, as it would with no snapshot at all.
TEST(Faults, AKilledRankResumesFromNodeMemory) {
  const std::string args = kRun.substr(0, kRun.find("--parallel.timeout_s")) +
                           "--train.steps=12 --checkpoint.memory_every_steps=5 --parallel.timeout_s=10";
  const std::string whole = testing::TempDir() + "memory_whole", dir = testing::TempDir() + "memory_killed";
  fs::remove_all(whole);
  fs::remove_all(dir);
  const CliRun reference = run(args + " --checkpoint.dir=" + whole + " --log.run_dir=" + whole + "_run", kMpirun + "2");
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  EXPECT_NE(reference.out.find("memory tier: step 10 in node memory"), std::string::npos) << reference.out;
  const std::map<int, std::string> expected = printed_losses(reference.out);
  ASSERT_EQ(expected.size(), 12u) << reference.out;
  // Runs the job until rank 1 is killed after step 7; the newest step it put in node memory
  // (5, unless the kill came late).
  const auto killed_run = [&] {
    fs::remove_all(dir);
    ChildProcess mpirun(kMpirun + "2 " + trident_bin() + " " + args + " --checkpoint.dir=" + dir + " --log.run_dir=" +
                        dir + "_run");
    EXPECT_TRUE(mpirun.wait_for_output("step  7/12", 120));
    const std::map<int, int> pids = rank_pids(mpirun.pid());
    EXPECT_TRUE(pids.count(1) > 0 && kill(pids.at(1), SIGKILL) == 0);
    EXPECT_TRUE(mpirun.wait_for_exit(60));
    EXPECT_NE(mpirun.output().find("memory tier: step 5 in node memory"), std::string::npos) << mpirun.output();
    return mpirun.output().find("memory tier: step 10 in node memory") != std::string::npos ? 10 : 5;
  };
  const auto resumed = [&] {
    return run(args + " --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run", kMpirun + "2");
  };
  const int in_memory = killed_run();
  // The last step the killed run's heartbeat names (written after a step's line: 6 to 8, as
  // the kill falls): the steps after the snapshot up to it are trained again.
  const std::optional<Heartbeat> beat = read_heartbeat(dir);
  ASSERT_TRUE(beat.has_value());
  EXPECT_GT(beat->step, in_memory);
  const CliRun r = resumed();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed from node memory: continuing after step " + std::to_string(in_memory)),
            std::string::npos)
      << r.out;
  const std::map<int, std::string> losses = printed_losses(r.out);
  ASSERT_EQ(losses.size(), static_cast<size_t>(12 - in_memory)) << r.out;
  for (const auto& [step, loss] : losses) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  EXPECT_NE(r.out.find("restart after step " + std::to_string(beat->step) + ": "), std::string::npos) << r.out;
  const int again = beat->step - in_memory;
  EXPECT_NE(r.out.find(", " + std::to_string(again) + (again == 1 ? " step (" : " steps (")), std::string::npos)
      << r.out;

  // A byte flipped in rank 0's newest snapshot.
  const std::string newest = "-r0-s" + std::to_string(killed_run());
  std::string snapshot;
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.size() >= newest.size() && name.compare(name.size() - newest.size(), newest.size(), newest) == 0)
      snapshot = e.path().string();
  }
  ASSERT_FALSE(snapshot.empty());
  {
    std::fstream f(snapshot, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x10));
  }
  const CliRun damaged = resumed();
  ASSERT_EQ(damaged.exit_code, 0) << damaged.out << damaged.err;
  EXPECT_NE(damaged.err.find("rank 0's snapshot of step " + newest.substr(5) +
                             " is not used: its CRC-32C does not match"),
            std::string::npos)
      << damaged.err;
  EXPECT_EQ(printed_losses(damaged.out), expected) << damaged.out;
  for (const auto& e : fs::directory_iterator("/dev/shm"))  // a complete run leaves none of its own
    EXPECT_EQ(e.path().filename().string().find("-s5"), std::string::npos) << e.path();
}

// A lost node: 4 ranks on two nodes (na: ranks 0-1, nb: ranks 2-3; TRIDENT_NODE_NAME plays
// them on this host), the memory tier every 3 steps, the disk's every 5. Rank 2 is killed
// after step 8 and node nb's memory is gone with it, as a replaced node's would be; the
// job restarted on na and a spare nc takes ranks 2-3's pieces from na's copies of them
// (the partner's) and prints the uninterrupted run's losses. Both copies lost (nb's and
// na's of ranks 2-3): the run resumes from the disk's step 5 instead, to the same losses.
TEST(Faults, ALostNodesPiecesComeFromItsPartner) {
  const std::string args = kRun.substr(0, kRun.find("--parallel.timeout_s")) +
                           "--train.steps=12 --checkpoint.memory_every_steps=3 --checkpoint.every_steps=5 "
                           "--parallel.ranks_per_node=2 --parallel.timeout_s=10";
  const auto on_nodes = [&](const std::string& first, const std::string& second, const std::string& dir,
                            const std::string& mpirun = kMpirun) {
    const std::string rank_args = " " + trident_bin() + " " + args + " --checkpoint.dir=" + dir + " --log.run_dir=" +
                                  dir + "_run";
    return mpirun + "2 env TRIDENT_NODE_NAME=" + first + rank_args + " : -np 2 env TRIDENT_NODE_NAME=" + second +
           rank_args;
  };
  const std::string whole = testing::TempDir() + "lost_whole", dir = testing::TempDir() + "lost_killed";
  fs::remove_all(whole);
  ChildProcess reference(on_nodes("na", "nb", whole));
  ASSERT_TRUE(reference.wait_for_exit(120));
  ASSERT_EQ(reference.exit_code(), 0) << reference.output();
  EXPECT_NE(reference.output().find("a copy of each node's on the next (2 nodes)"), std::string::npos)
      << reference.output();
  const std::map<int, std::string> expected = printed_losses(reference.output());
  ASSERT_EQ(expected.size(), 12u) << reference.output();
  // The snapshot files of node `node` in this run (their names hold the run's key).
  const auto files_of = [](const std::string& node, const std::string& ranks) {
    std::vector<fs::path> found;
    const std::regex name("trident-[0-9a-f]{16}-" + node + "-r[" + ranks + "]-s[0-9]+");
    for (const auto& e : fs::directory_iterator("/dev/shm"))
      if (std::regex_match(e.path().filename().string(), name)) found.push_back(e.path());
    return found;
  };
  // Kills rank 2 after step 8 (every partner copy of step 6 is kept by then: the copies
  // finish within the step after the snapshot) and empties node nb's memory.
  const auto kill_node_nb = [&] {
    fs::remove_all(dir);
    // Rank 0 slowed by 200 ms a step: the kill falls between the lines of steps 8 and 10.
    ChildProcess job("env TRIDENT_TEST_SLOW_RANK=0 TRIDENT_TEST_SLOW_MS=200 " +
                     on_nodes("na", "nb", dir, "mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "
                                               "-x TRIDENT_TEST_SLOW_RANK -x TRIDENT_TEST_SLOW_MS -np "));
    EXPECT_TRUE(job.wait_for_output("step  8/12", 120));
    const std::map<int, int> pids = rank_pids(job.pid());
    EXPECT_TRUE(pids.count(2) > 0 && kill(pids.at(2), SIGKILL) == 0);
    EXPECT_TRUE(job.wait_for_exit(60));
    EXPECT_NE(job.output().find("checkpoint: step 5 saved"), std::string::npos) << job.output();
    EXPECT_EQ(job.output().find("checkpoint: step 10 saved"), std::string::npos) << "killed too late\n" << job.output();
    for (const fs::path& f : files_of("nb", "0-3")) fs::remove(f);
  };
  kill_node_nb();
  ChildProcess resumed(on_nodes("na", "nc", dir));
  ASSERT_TRUE(resumed.wait_for_exit(120));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output();
  std::smatch m;
  const std::string out = resumed.output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("resumed from node memory: continuing after step (\\d+) \\(ranks "
                                                   "0-1 from their own node's memory in [0-9.]+ s; ranks 2-3 from node "
                                                   "na's copy \\(partner\\) in [0-9.]+ s; the disk's newest "
                                                   "checkpoint is step 5\\)")))
      << out;
  std::printf("%s\n", m[0].str().c_str());
  const int from = std::stoi(m[1]);
  EXPECT_TRUE(from == 6 || from == 9) << from;
  const std::map<int, std::string> losses = printed_losses(out);
  ASSERT_EQ(losses.size(), static_cast<size_t>(12 - from)) << out;
  for (const auto& [step, loss] : losses) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  EXPECT_TRUE(files_of("n[abc]", "0-3").empty()) << "a complete run leaves its snapshots";

  // Both copies of ranks 2-3 lost: the disk's step 5.
  kill_node_nb();
  for (const fs::path& f : files_of("na", "23")) fs::remove(f);
  ChildProcess from_disk(on_nodes("na", "nc", dir));
  ASSERT_TRUE(from_disk.wait_for_exit(120));
  ASSERT_EQ(from_disk.exit_code(), 0) << from_disk.output();
  EXPECT_EQ(from_disk.output().find("resumed from node memory"), std::string::npos) << from_disk.output();
  EXPECT_EQ(printed_losses(from_disk.output()).size(), 7u) << from_disk.output();
  for (const auto& [step, loss] : printed_losses(from_disk.output())) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  for (const char* node : {"na", "nb"})
    for (const fs::path& f : files_of(node, "0-3")) fs::remove(f);  // the killed run's, that no complete run removed
}

// The memory tier's folder without room (checkpoint.memory_dir on a small tmpfs; needs root
// to mount it). 16 MiB, where the tiny model's two ranks need three snapshots of about 10
// MiB each: one warning at the start, and the run trains to the end with the disk tier
// alone, at the losses of a run without the tier. 64 MiB that a file fills after the first
// snapshot: the save after step 10 finds no room, one warning, the same losses.
TEST(Faults, AMemoryFolderWithoutRoomIsOneWarning) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string shm = testing::TempDir() + "small_shm";
  fs::create_directories(shm);
  const auto mount_tmpfs = [&](const std::string& size) {
    return std::system(("mount -t tmpfs -o size=" + size + " tmpfs " + shm + " 2>/dev/null").c_str()) == 0;
  };
  const auto unmount = [&] { return std::system(("umount " + shm).c_str()) == 0; };
  if (!mount_tmpfs("16m")) GTEST_SKIP() << "mount -t tmpfs is refused here";
  struct Unmounted {  // whatever ends the test
    std::string path;
    ~Unmounted() { std::system(("umount " + path + " 2>/dev/null").c_str()); }
  } unmounted{shm};
  const std::string args = kRun + "--train.steps=12 --checkpoint.memory_dir=" + shm + " --checkpoint.dir=" +
                           testing::TempDir() + "small_shm_";
  const CliRun plain = run(args + "plain", kMpirun + "2");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::map<int, std::string> expected = printed_losses(plain.out);
  ASSERT_EQ(expected.size(), 12u) << plain.out;

  const CliRun small = run(args + "small --checkpoint.memory_every_steps=5", kMpirun + "2");
  EXPECT_EQ(small.exit_code, 0) << small.err;
  EXPECT_EQ(count(small.err, "warning: memory tier: "), 1) << small.err;
  EXPECT_NE(small.err.find("a node needs"), std::string::npos) << small.err;
  EXPECT_EQ(small.out.find("in node memory"), std::string::npos) << small.out;
  EXPECT_EQ(printed_losses(small.out), expected);
  ASSERT_TRUE(unmount());

  ASSERT_TRUE(mount_tmpfs("64m"));
  // Rank 0 slowed by 100 ms a step: the file is written well before step 10.
  ChildProcess job("env TRIDENT_TEST_SLOW_RANK=0 TRIDENT_TEST_SLOW_MS=100 " + kMpirun +
                   "2 -x TRIDENT_TEST_SLOW_RANK -x TRIDENT_TEST_SLOW_MS " + trident_bin() + " " + args +
                   "filled --checkpoint.memory_every_steps=5");
  EXPECT_TRUE(job.wait_for_output("memory tier: step 5 in node memory", 120));
  {  // all but 256 KiB of what is left
    struct statvfs st {};
    ASSERT_EQ(statvfs(shm.c_str(), &st), 0);
    const size_t left = static_cast<size_t>(st.f_bavail) * st.f_frsize;
    std::ofstream filler(shm + "/filler", std::ios::binary);
    const std::vector<char> block(1 << 16, 'x');
    for (size_t written = 0; written + block.size() + (256 << 10) <= left; written += block.size())
      filler.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  ASSERT_TRUE(job.wait_for_exit(120));
  EXPECT_EQ(job.exit_code(), 0) << job.output();
  EXPECT_EQ(count(job.output(), "warning: memory tier: "), 1) << job.output();
  EXPECT_NE(job.output().find("could not write the snapshot of step 10"), std::string::npos) << job.output();
  EXPECT_EQ(printed_losses(job.output()), expected);
}

// One rank slowed by 300 ms a step (as a throttled GPU would be): rank 0 names it at every
// log step, against the median of its own pipeline stage, and counts it in summary.json.
TEST(Faults, ASlowRankIsNamedAsTheStraggler) {
  struct Case {
    std::string layout;
    int slow_rank;
    std::string named;
  };
  for (const Case& c : {Case{"", 2, "straggler: rank 2 (dp 2, tp 0, pp 0) worked "},
                        Case{"--parallel.pp=2 --train.micro_batch=2 ", 3, "straggler: rank 3 (dp 1, tp 0, pp 1) worked "}}) {
    const std::string dir = testing::TempDir() + "straggler";
    fs::remove_all(dir);
    const CliRun r = run(kRun + c.layout + "--train.steps=4 --log.run_dir=" + dir,
                         "env TRIDENT_TEST_SLOW_RANK=" + std::to_string(c.slow_rank) + " TRIDENT_TEST_SLOW_MS=300 " +
                             kMpirun + "4 -x TRIDENT_TEST_SLOW_RANK -x TRIDENT_TEST_SLOW_MS",
                         120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(count(r.out, c.named), 4) << r.out;  // every step is a log step here
    EXPECT_NE(r.out.find(c.layout.empty() ? "of its stage's 4 ranks" : "of its stage's 2 ranks"), std::string::npos)
        << r.out;
    std::ifstream summary(dir + "/summary.json");
    EXPECT_EQ(nlohmann::json::parse(summary).value("straggler_reports", -1), 4);
  }
}

// The same slow rank, with log.straggler_limit: three log steps in a row end the run with
// exit 3 and its node named.
TEST(Faults, AStragglerPastTheLimitEndsTheRunNamingItsNode) {
  const std::string dir = testing::TempDir() + "straggler_limit";
  fs::remove_all(dir);
  const CliRun r = run(kRun + "--train.steps=20 --log.straggler_limit=3 --checkpoint.dir=" + dir + " --log.run_dir=" +
                           dir + "_run",
                       "env TRIDENT_TEST_SLOW_RANK=2 TRIDENT_TEST_SLOW_MS=300 " + kMpirun +
                           "4 -x TRIDENT_TEST_SLOW_RANK -x TRIDENT_TEST_SLOW_MS",
                       120);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_EQ(count(r.out, "straggler: rank 2 "), 3) << r.out;
  EXPECT_EQ(count(r.err, "trident: error (exit 3, a retry may succeed): rank 2 a straggler for 3 log steps"), 1) << r.err;
  const health::Verdict v = health::from_json(slurp(health::verdict_path(dir)));
  EXPECT_EQ(v.ranks, std::vector<int>{2});
  EXPECT_EQ(v.host, health::node_name());
  EXPECT_TRUE(std::regex_search(v.evidence, std::regex("step [0-9]+: [0-9.]+x, step [0-9]+: [0-9.]+x, step [0-9]+: "
                                                       "[0-9.]+x; last: straggler: rank 2 ")))
      << v.evidence;
}

// A GPU whose XID count rises at two log steps (log.gpu_error_limit 2): its machine is
// named, with the counts; one rise alone, or rises on different machines, are not enough.
TEST(Faults, GpuErrorsAtTwoLogStepsNameTheMachine) {
  const auto machine = [](const std::string& host, unsigned long long xid, unsigned long long ecc) {
    MachineSample m;
    m.host = host;
    GpuSample g;
    g.index = 3;
    g.xid_errors = xid;
    g.last_xid = 79;
    g.ecc_uncorrected = ecc;
    m.gpus = {g};
    return m;
  };
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  GpuErrorStreak streak(2);
  EXPECT_FALSE(streak.observe({machine("a", 0, 0), machine("b", 0, 0)}, 10, hosts));
  EXPECT_FALSE(streak.observe({machine("a", 1, 0), machine("b", 0, 0)}, 20, hosts));  // a: once
  EXPECT_FALSE(streak.observe({machine("a", 1, 0), machine("b", 0, 2)}, 30, hosts));  // b: once
  const auto v = streak.observe({machine("a", 1, 0), machine("b", 0, 5)}, 40, hosts);  // b: twice
  ASSERT_TRUE(v);
  EXPECT_EQ(v->host, "b");
  EXPECT_EQ(v->ranks, (std::vector<int>{2, 3}));
  EXPECT_NE(v->evidence.find("step 30: GPU 3 uncorrected ECC errors 0 -> 2"), std::string::npos) << v->evidence;
  EXPECT_NE(v->evidence.find("step 40: GPU 3 uncorrected ECC errors 2 -> 5"), std::string::npos) << v->evidence;
  GpuErrorStreak off(0);
  for (int i = 0; i < 5; i++) EXPECT_FALSE(off.observe({machine("a", i, 0)}, i, hosts));
}

// Silent data corruption: one bit of rank 1's parameters flipped after step 6 (3 dp
// replicas): the replica check at step 8 names rank 1 against ranks 0 and 2, the run goes
// back to step 4's checkpoint and ends with the losses of a run without the fault. A
// second flip (after step 10) ends the run at step 12 with exit 3, naming rank 1's node.
TEST(Faults, AFlippedBitIsCaughtByTheReplicaCheckAndRecoveredOnce) {
  const std::string dir = testing::TempDir() + "replica";
  const std::string flags = kRun + "--train.steps=16 --train.global_batch=12 --train.replica_check_steps=4 "
                                   "--checkpoint.every_steps=4 --checkpoint.dir=" + dir;
  const auto flipping = [](const std::string& steps) {
    return "env TRIDENT_TEST_FLIP_BIT=1:" + steps + " " + kMpirun + "3 -x TRIDENT_TEST_FLIP_BIT";
  };
  fs::remove_all(dir);
  fs::remove_all(dir + "_clean");
  const CliRun clean = run(flags + "_clean --log.run_dir=" + dir + "_clean_run", kMpirun + "3", 120);
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_NE(clean.out.find("replica check: every 4 steps, the parameters across each dp group"), std::string::npos)
      << clean.out;
  const std::string last = "step 16/16 | loss ";
  ASSERT_NE(clean.out.find(last), std::string::npos) << clean.out;
  const std::string clean_loss = clean.out.substr(clean.out.find(last), last.size() + 6);

  const CliRun once = run(flags + " --log.run_dir=" + dir + "_run", flipping("6"), 120);
  EXPECT_EQ(once.exit_code, 0) << once.out << once.err;
  EXPECT_NE(once.out.find("replica check at step 8: parameters that should be equal differ: rank 1 differs from "
                          "ranks 0, 2 (dp group of rank 0)"),
            std::string::npos)
      << once.out;
  EXPECT_NE(once.out.find("resumed from " + dir + "/step_00000004"), std::string::npos) << once.out;
  EXPECT_NE(once.out.find(clean_loss), std::string::npos) << "not the clean run's " << clean_loss << ":\n" << once.out;
  EXPECT_FALSE(fs::exists(health::verdict_path(dir)));

  fs::remove_all(dir);
  const CliRun twice = run(flags + " --log.run_dir=" + dir + "_run2", flipping("6,10"), 120);
  EXPECT_EQ(twice.exit_code, 3) << twice.out << twice.err;
  EXPECT_EQ(count(twice.out, "replica check at step"), 2) << twice.out;
  const health::Verdict v = health::from_json(slurp(health::verdict_path(dir)));
  EXPECT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_EQ(v.host, health::node_name());
  EXPECT_EQ(v.reason, "replica check: rank 1's parameters differ a second time");
  EXPECT_NE(v.evidence.find("replica check at step 12"), std::string::npos) << v.evidence;
  // The corrupted state of step 12 was not saved.
  EXPECT_FALSE(fs::exists(dir + "/step_00000012"));
}

// Where a verdict could not be written: one error at the start, exit 2.
TEST(Faults, AHealthFolderThatCannotBeWrittenIsOneErrorAtTheStart) {
  const std::string dir = testing::TempDir() + "readonly_ckpt";
  fs::remove_all(dir);
  fs::create_directories(dir + "/health");
  fs::permissions(dir + "/health", fs::perms::owner_read | fs::perms::owner_exec);
  if (getuid() == 0) {  // root writes anyway: a file where the folder should be
    fs::remove_all(dir + "/health");
    std::ofstream(dir + "/health") << "not a folder";
  }
  const CliRun r = run(kRun + "--train.steps=2 --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_run",
                       kMpirun + "2", 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count(r.err, "trident: error: cannot write health verdicts to " + dir + "/health"), 1) << r.err;
  fs::permissions(dir + "/health", fs::perms::owner_all, fs::perm_options::add);
}

}  // namespace
}  // namespace trident
