// One checkpoint folder, one run (issue 31): the lease on checkpoint.dir. First its
// logic in this process (judging a lease, taking, refusing, taking over, losing it,
// racing takers on threads); then through the executable: a second run on a folder in
// use ends at once with exit 2 naming the first (under mpirun too, on every rank) while
// the first's checkpoints stay its own; a holder killed with kill -9, or stopped past its
// lease_s, is taken over with a warning naming it (and the stopped one, resumed, ends
// with exit 2 writing nothing); a requeue under the same Slurm job id takes over at once;
// a read-only or full folder is one error, exit 2.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "child_process.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_lease.h"
#include "cli_helpers.h"
#include "kernels/base/error.h"
#include "runtime/wall_clock.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + "lease_" + name;
  fs::remove_all(dir);
  return dir;
}

CheckpointLease::Options options(double lease_s) {
  CheckpointLease::Options o;
  o.lease_s = lease_s;
  o.min_lease_s = 30;
  o.settle_s = 0.01;
  return o;
}

// A lease as another run would have left it.
void write_lease(const std::string& dir, const LeaseHolder& h) {
  fs::create_directories(dir);
  std::ofstream(dir + "/LEASE") << lease_json(h);
}

// The message of the UsageError that `f` throws ("" if none).
template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// ---- judging a lease: pure ----

TEST(LeaseLogic, JudgesLiveStaleSameJobAndGoneProcesses) {
  LeaseHolder holder = this_process(10), me = this_process(10);
  holder.host = "node-a";
  holder.renewed = 1000;
  EXPECT_EQ(judge_lease(holder, me, 1005, 0, 30, false).kind, LeaseVerdict::live);
  const LeaseVerdict stale = judge_lease(holder, me, 1011, 0, 30, false);
  EXPECT_EQ(stale.kind, LeaseVerdict::stale);
  EXPECT_NE(stale.why.find("not renewed for 11 s (its lease_s: 10 s)"), std::string::npos) << stale.why;
  // The file's time counts when it is later (a holder whose clock lags).
  EXPECT_EQ(judge_lease(holder, me, 1011, 1008, 30, false).kind, LeaseVerdict::live);
  // A lease naming no lease_s: ours.
  holder.lease_s = 0;
  EXPECT_EQ(judge_lease(holder, me, 1011, 0, 30, false).kind, LeaseVerdict::live);
  EXPECT_EQ(judge_lease(holder, me, 1031, 0, 30, false).kind, LeaseVerdict::stale);
  EXPECT_EQ(judge_lease(holder, me, 1001, 0, 30, true).kind, LeaseVerdict::process_gone);
  // The same Slurm job (a requeue) takes it at once; no job id never matches.
  holder.job = me.job = "4242";
  EXPECT_EQ(judge_lease(holder, me, 1001, 0, 30, false).kind, LeaseVerdict::same_job);
  holder.job = me.job = "";
  EXPECT_EQ(judge_lease(holder, me, 1001, 0, 30, false).kind, LeaseVerdict::live);
}

TEST(LeaseLogic, TheLeaseFileRoundTripsAndNamesItsHolder) {
  LeaseHolder h = this_process(12.5);
  h.job = "77";
  h.array_job = "70";
  h.array_task = "7";
  const LeaseHolder back = parse_lease(lease_json(h));
  EXPECT_EQ(back.host, h.host);
  EXPECT_EQ(back.pid, h.pid);
  EXPECT_EQ(back.nonce, h.nonce);
  EXPECT_EQ(back.start_ticks, h.start_ticks);
  EXPECT_EQ(back.lease_s, 12.5);
  EXPECT_NE(h.start_ticks, 0u);
  EXPECT_EQ(h.nonce.size(), 32u);
  EXPECT_NE(this_process(1).nonce, h.nonce);
  const std::string said = back.describe(back.renewed + 3);
  EXPECT_NE(said.find("host " + h.host + ", pid " + std::to_string(getpid()) + ", Slurm job 77 (array 70_7), lease "
                      "renewed 3.0 s ago"),
            std::string::npos)
      << said;
  EXPECT_THROW(parse_lease("{\"host\": 1}"), UsageError);
  EXPECT_THROW(parse_lease("garbage"), UsageError);
}

// The state of a process (/proc/PID/stat's third field).
std::string first_field_after_name(const std::string& stat_path) {
  const std::string stat = slurp(stat_path);
  const size_t end = stat.rfind(')');
  return end == std::string::npos ? "" : stat.substr(end + 2, 1);
}

// A process of this machine that has ended (its pid free, or reused by another start).
TEST(LeaseLogic, AHolderProcessOfThisMachineIsGoneOnlyWhenItIs) {
  const LeaseHolder me = this_process(1);
  LeaseHolder holder = this_process(1);
  EXPECT_FALSE(holder_process_gone(holder, me));  // this very process
  const pid_t child = fork();
  if (child == 0) _exit(0);
  // Ended, not yet reaped (a zombie: kill(pid, 0) still succeeds).
  for (int i = 0; i < 1000 && first_field_after_name("/proc/" + std::to_string(child) + "/stat") != "Z"; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  holder.pid = child;
  EXPECT_TRUE(holder_process_gone(holder, me));
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(holder_process_gone(holder, me));
  holder.host = "another-machine";  // elsewhere: only the lease's age can tell
  EXPECT_FALSE(holder_process_gone(holder, me));
}

// ---- taking, refusing, taking over, losing: files in one folder ----

TEST(LeaseLogic, AFreeFolderIsTakenRenewedAndReleased) {
  const std::string dir = fresh_dir("free") + "/made/on/the/way";
  fs::create_directories(dir);
  // What a writer killed in its moment left: a temporary and a claim, an hour old, and a
  // temporary of now (another taker's, at work): only the old ones are removed.
  for (const char* name : {"/.LEASE.0123.tmp", "/.LEASE.claim.4567"}) {
    std::ofstream(dir + name) << "{}";
    fs::last_write_time(dir + name, fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  std::ofstream(dir + "/.LEASE.89ab.tmp") << "{}";
  {
    CheckpointLease lease(dir, options(2));
    EXPECT_FALSE(fs::exists(dir + "/.LEASE.0123.tmp"));
    EXPECT_FALSE(fs::exists(dir + "/.LEASE.claim.4567"));
    ASSERT_TRUE(fs::exists(dir + "/.LEASE.89ab.tmp"));
    fs::remove(dir + "/.LEASE.89ab.tmp");
    EXPECT_EQ(lease.taken_over(), "");
    const LeaseHolder written = parse_lease(slurp(dir + "/LEASE"));
    EXPECT_EQ(written.nonce, lease.me().nonce);
    EXPECT_EQ(written.pid, getpid());
    EXPECT_EQ(written.lease_s, 2);
    EXPECT_EQ(lease.renew_every_s(), 0.5);
    EXPECT_TRUE(lease.renew(/*check_now=*/true));
    EXPECT_TRUE(lease.renew());
  }
  EXPECT_FALSE(fs::exists(dir + "/LEASE"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 0);  // no temporary left
}

TEST(LeaseLogic, ALiveLeaseRefusesASecondRunNamingItsHolder) {
  const std::string dir = fresh_dir("live");
  LeaseHolder elsewhere = this_process(60);
  elsewhere.host = "node-17";
  elsewhere.pid = 4321;
  elsewhere.job = "99";
  write_lease(dir, elsewhere);
  const std::string error = usage_error_of([&] { CheckpointLease second(dir, options(60)); });
  EXPECT_NE(error.find("checkpoint.dir " + dir + " is in use by another run: host node-17, pid 4321, Slurm job 99, "
                       "lease renewed"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("(live: stale at "), std::string::npos) << error;
  EXPECT_NE(error.find("unless renewed, its lease_s being 60 s)"), std::string::npos) << error;
  EXPECT_EQ(parse_lease(slurp(dir + "/LEASE")).nonce, elsewhere.nonce);  // untouched
  // A holder in this process too (a live pid of this machine).
  const std::string dir2 = fresh_dir("live2");
  CheckpointLease first(dir2, options(60));
  EXPECT_NE(usage_error_of([&] { CheckpointLease second(dir2, options(60)); }).find("pid " + std::to_string(getpid())),
            std::string::npos);
  EXPECT_TRUE(first.renew(true));
}

// `ckpt ls` says who holds the folder: a live holder, a stale one, or none.
TEST(LeaseLogic, CkptLsNamesTheHolder) {
  const std::string dir = fresh_dir("ls");
  fs::create_directories(dir);
  const CliRun none = run("ckpt ls --checkpoint.dir=" + dir);
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("lease: none (no run holds this folder)"), std::string::npos) << none.out;
  LeaseHolder holder = this_process(60);
  holder.host = "node-17";
  holder.pid = 4321;
  holder.job = "99";
  write_lease(dir, holder);
  const CliRun live = run("ckpt ls --checkpoint.dir=" + dir);
  EXPECT_NE(live.out.find("lease: host node-17, pid 4321, Slurm job 99, lease renewed "), std::string::npos) << live.out;
  EXPECT_NE(live.out.find("(live: stale at "), std::string::npos) << live.out;
  EXPECT_NE(live.out.find("unless renewed, its lease_s being 60 s)"), std::string::npos) << live.out;
  holder.renewed -= 120;
  write_lease(dir, holder);
  const auto old = fs::file_time_type::clock::now() - std::chrono::seconds(120);
  fs::last_write_time(dir + "/LEASE", old);  // the file's time counts too
  const CliRun stale = run("ckpt ls --checkpoint.dir=" + dir);
  EXPECT_NE(stale.out.find("(free to take: not renewed for "), std::string::npos) << stale.out;
}

TEST(LeaseLogic, AStaleLeaseIsTakenOverNamingItsHolder) {
  const std::string dir = fresh_dir("stale");
  LeaseHolder old = this_process(5);
  old.host = "node-3";
  old.pid = 555;
  old.renewed = unix_seconds() - 60;
  write_lease(dir, old);
  fs::last_write_time(dir + "/LEASE", fs::file_time_type::clock::now() - std::chrono::seconds(60));
  CheckpointLease lease(dir, options(5));
  EXPECT_NE(lease.taken_over().find("host node-3, pid 555"), std::string::npos) << lease.taken_over();
  EXPECT_NE(lease.taken_over().find("not renewed for"), std::string::npos) << lease.taken_over();
  EXPECT_EQ(parse_lease(slurp(dir + "/LEASE")).nonce, lease.me().nonce);
}

// A requeue of the same Slurm job takes the lease at once; the job's earlier incarnation
// (a zombie still running) finds it gone at its next check and says who has it.
TEST(LeaseLogic, TheSameJobTakesOverAtOnceAndTheEarlierHolderLosesIt) {
  const std::string dir = fresh_dir("requeue");
  LeaseHolder first_me = this_process(60), second_me = this_process(60);
  first_me.job = second_me.job = "4242";
  second_me.restart = "1";
  CheckpointLease first(dir, options(60), first_me);
  CheckpointLease second(dir, options(60), second_me);
  EXPECT_NE(second.taken_over().find("the same Slurm job 4242 (a requeue)"), std::string::npos) << second.taken_over();
  EXPECT_FALSE(first.renew(/*check_now=*/true));
  EXPECT_NE(first.lost_to().find("another run holds it now: host"), std::string::npos) << first.lost_to();
  EXPECT_TRUE(second.renew(true));
  first.release();  // not its own any more: left alone
  EXPECT_EQ(parse_lease(slurp(dir + "/LEASE")).nonce, second.me().nonce);
  // A lease removed under its holder is lost too (another run took it and ended).
  fs::remove(dir + "/LEASE");
  EXPECT_FALSE(second.renew(true));
  EXPECT_NE(second.lost_to().find("was removed"), std::string::npos) << second.lost_to();
}

TEST(LeaseLogic, ANonLeaseFileIsJudgedByItsAge) {
  const std::string dir = fresh_dir("garbage");
  fs::create_directories(dir);
  std::ofstream(dir + "/LEASE") << "half a lease";
  EXPECT_NE(usage_error_of([&] { CheckpointLease l(dir, options(5)); }).find("(unreadable lease)"), std::string::npos);
  fs::last_write_time(dir + "/LEASE", fs::file_time_type::clock::now() - std::chrono::seconds(60));
  CheckpointLease lease(dir, options(5));  // older than our fallback (30 s): taken
  EXPECT_NE(lease.taken_over().find("not renewed"), std::string::npos) << lease.taken_over();
}

TEST(LeaseLogic, AFolderThatCannotBeWrittenIsOneUsageError) {
  const std::string dir = fresh_dir("file");
  std::ofstream(dir) << "a file where the folder should be";
  const std::string error = usage_error_of([&] { CheckpointLease l(dir, options(5)); });
  EXPECT_NE(error.find("cannot take the lease on checkpoint.dir " + dir), std::string::npos) << error;
  fs::remove(dir);
}

// Takers starting at the same moment, on threads (each its own nonce, as separate runs
// have): exactly one holds the folder, every other is refused naming a holder.
void race(const std::string& dir, int takers, const std::string& expect_taken_over) {
  std::vector<std::unique_ptr<CheckpointLease>> won(takers);
  std::vector<std::string> errors(takers);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < takers; t++)
    threads.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      try {
        won[t] = std::make_unique<CheckpointLease>(dir, options(30));
      } catch (const UsageError& e) {
        errors[t] = e.what();
      }
    });
  go = true;
  for (std::thread& t : threads) t.join();
  int winners = 0, still_holding = 0;
  for (int t = 0; t < takers; t++) {
    if (won[t]) {
      winners++;
      still_holding += won[t]->renew(/*check_now=*/true);
      EXPECT_NE(won[t]->taken_over().find(expect_taken_over), std::string::npos) << won[t]->taken_over();
    } else {
      EXPECT_NE(errors[t].find("is in use by another run: host"), std::string::npos) << errors[t];
    }
  }
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(still_holding, 1);
}

TEST(LeaseLogic, TakersRacingForAFreeFolderLeaveExactlyOneHolder) {
  for (int round = 0; round < 5; round++) race(fresh_dir("race_free"), 8, "");
}

TEST(LeaseLogic, TakersRacingForAStaleLeaseLeaveExactlyOneHolder) {
  for (int round = 0; round < 5; round++) {
    const std::string dir = fresh_dir("race_stale");
    LeaseHolder old = this_process(5);
    old.host = "node-dead";
    old.renewed = unix_seconds() - 100;
    write_lease(dir, old);
    fs::last_write_time(dir + "/LEASE", fs::file_time_type::clock::now() - std::chrono::seconds(100));
    race(dir, 8, "host node-dead");
    for (const auto& entry : fs::directory_iterator(dir))  // no claim or temporary left behind
      EXPECT_EQ(entry.path().filename(), "LEASE");
  }
}

// ---- through the executable ----

// A tiny run whose steps take at least 40 ms each (rank 0 slowed), so that a holder is
// still training while the test acts; the first step line says it is training.
const std::string kTrain = "train --config configs/tiny.ini --model.n_layer=1 --model.d_model=32 --model.seq_len=32 "
                           "--train.global_batch=2 --log.every_steps=1 --log.val_batches=0 --log.peak_gflops=1 "
                           "--parallel.timeout_s=30 --train.warmup_steps=1 ";
const std::string kSlow = "env TRIDENT_TEST_SLOW_RANK=0 TRIDENT_TEST_SLOW_MS=40 ";
// No Slurm job of the test's own reaches the runs unless a test gives one.
const std::string kNoSlurm = "env -u SLURM_JOB_ID -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID -u SLURM_RESTART_COUNT ";

std::string holder_command(const std::string& dir, const std::string& more, const std::string& env = "") {
  return kNoSlurm + env + kSlow + trident_bin() + " " + kTrain + "--train.steps=2000 --checkpoint.dir=" + dir +
         " --log.run_dir=" + dir + "_run " + more;
}

// Waits (bounded) until the lease file has not changed for `seconds`.
testing::AssertionResult wait_until_unrenewed(const std::string& lease, double seconds, double limit_s) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < limit_s) {
    std::error_code ec;
    const auto changed = fs::last_write_time(lease, ec);
    if (!ec && std::chrono::duration<double>(fs::file_time_type::clock::now() - changed).count() > seconds)
      return testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return testing::AssertionFailure() << lease << " was still renewed after " << limit_s << " s";
}

// (a) Two runs on one folder: the second (1 rank, and 2 ranks under mpirun) ends at once
// with exit 2, one error naming the first; the first goes on, saves, and ends in order
// (here on SIGTERM: a checkpoint, exit 0), its checkpoints its own, the lease removed.
TEST(LeaseCli, ASecondRunOnAFolderInUseEndsAtOnceNamingTheFirst) {
  const std::string dir = fresh_dir("cli_two");
  ChildProcess first(holder_command(dir, "--checkpoint.every_steps=2"));
  ASSERT_TRUE(first.wait_for_output("checkpoint: step 2 saved", 120));
  const std::string holder = "host " + parse_lease(slurp(dir + "/LEASE")).host + ", pid " + std::to_string(first.pid());
  const auto started = std::chrono::steady_clock::now();
  const CliRun second = run(kTrain + "--train.steps=4 --train.seed=99 --checkpoint.every_steps=1 --checkpoint.dir=" +
                                dir + " --log.run_dir=" + dir + "_second",
                            kNoSlurm, 60);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_EQ(count(second.err, "trident: error:"), 1) << second.err;
  EXPECT_NE(second.err.find("trident: error: checkpoint.dir " + dir + " is in use by another run: " + holder),
            std::string::npos)
      << second.err;
  EXPECT_EQ(second.out.find(" | loss"), std::string::npos) << second.out;  // no step trained
  // Under mpirun: every rank ends with exit 2, one message, no abort.
  const CliRun both = run(kTrain + "--train.steps=4 --checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_mpi",
                          kNoSlurm + kMpirun + "2", 60);
  const double refused_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_EQ(count(both.err, "trident: error:"), 1) << both.err;
  EXPECT_NE(both.err.find("is in use by another run: " + holder), std::string::npos) << both.err;
  EXPECT_EQ(both.err.find("MPI_ABORT"), std::string::npos) << both.err;
  std::printf("two refusals (1 rank, 2 ranks) in %.1f s\n", refused_s);
  // The first trained on meanwhile, then ends in order.
  ASSERT_FALSE(first.ended()) << first.output();
  kill(first.pid(), SIGTERM);
  ASSERT_TRUE(first.wait_for_exit(60));
  EXPECT_EQ(first.exit_code(), 0) << first.output();
  EXPECT_NE(first.output().find("on a signal, checkpoint saved"), std::string::npos) << first.output();
  EXPECT_FALSE(fs::exists(dir + "/LEASE"));
  const std::optional<Manifest> latest = find_latest_checkpoint(dir, /*quiet=*/true);
  ASSERT_TRUE(latest.has_value());
  for (const std::string& step : complete_checkpoints(dir)) {
    const Manifest m = read_manifest(step);  // every file present, its CRC right
    EXPECT_NE(m.config_ini.find("seed = 1234"), std::string::npos) << step;  // the first run's, not the second's
  }
}

// (b) A holder killed with kill -9 on this machine: its process is gone, so the next run
// takes over at once with a warning naming it.
TEST(LeaseCli, AHolderKilledWithKill9IsTakenOverWithAWarning) {
  const std::string dir = fresh_dir("cli_killed");
  ChildProcess first(holder_command(dir, "--checkpoint.every_steps=2"));
  ASSERT_TRUE(first.wait_for_output("checkpoint: step 2 saved", 120));
  const int pid = first.pid();
  kill(pid, SIGKILL);
  ASSERT_TRUE(first.wait_for_exit(30));
  ASSERT_TRUE(fs::exists(dir + "/LEASE"));  // left behind
  const CliRun next = run(kTrain + "--train.steps=6 --checkpoint.every_steps=2 --checkpoint.dir=" + dir +
                              " --log.run_dir=" + dir + "_next",
                          kNoSlurm, 120);
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_NE(next.err.find("trident: warning: taking over checkpoint.dir " + dir + " from the run that held it: host "),
            std::string::npos)
      << next.err;
  EXPECT_NE(next.err.find("pid " + std::to_string(pid) + ", "), std::string::npos) << next.err;
  EXPECT_NE(next.err.find("its process " + std::to_string(pid) + " on this machine is gone"), std::string::npos)
      << next.err;
  EXPECT_NE(next.out.find("resumed from"), std::string::npos) << next.out;
  EXPECT_FALSE(fs::exists(dir + "/LEASE"));
}

// (b') A holder that stops renewing while alive (SIGSTOP: as a hung or partitioned node
// looks from elsewhere): stale after its lease_s, taken over with a warning; resumed, it
// finds its lease gone and ends with exit 2, writing nothing more.
TEST(LeaseCli, AHolderUnrenewedPastItsLeaseIsTakenOverAndEndsWhenItWakes) {
  const std::string dir = fresh_dir("cli_stale");
  const double lease_s = 2;
  // checkpoint.every_steps=0: the holder has no save of its own in flight when stopped.
  ChildProcess first(holder_command(dir, "--checkpoint.lease_s=2"));
  ASSERT_TRUE(first.wait_for_output("/2000 | loss", 120));
  kill(first.pid(), SIGSTOP);
  ASSERT_TRUE(wait_until_unrenewed(dir + "/LEASE", lease_s + 0.3, 30));
  const CliRun next = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.lease_s=2 --checkpoint.dir=" +
                              dir + " --log.run_dir=" + dir + "_next",
                          kNoSlurm, 120);
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_NE(next.err.find("trident: warning: taking over checkpoint.dir " + dir + " from the run that held it: host "),
            std::string::npos)
      << next.err;
  EXPECT_NE(next.err.find("pid " + std::to_string(first.pid()) + ", "), std::string::npos) << next.err;
  EXPECT_NE(next.err.find("not renewed for"), std::string::npos) << next.err;
  EXPECT_NE(next.err.find("(its lease_s: 2.0 s)"), std::string::npos) << next.err;
  const std::vector<std::string> saved = complete_checkpoints(dir);
  kill(first.pid(), SIGCONT);
  ASSERT_TRUE(first.wait_for_exit(60));
  EXPECT_EQ(first.exit_code(), 2) << first.output();
  EXPECT_NE(first.output().find("trident: error: this run lost its lease on checkpoint.dir " + dir), std::string::npos)
      << first.output();
  EXPECT_EQ(complete_checkpoints(dir), saved);
  EXPECT_EQ(read_manifest(dir + "/step_00000004").step, 4);
}

// (c) A requeue: the same SLURM_JOB_ID takes over at once from a holder still running (the
// previous incarnation), which then ends with exit 2 at its next renewal.
TEST(LeaseCli, ARequeueUnderTheSameSlurmJobTakesOverAtOnce) {
  const std::string dir = fresh_dir("cli_requeue");
  ChildProcess first(holder_command(dir, "--checkpoint.lease_s=2", "SLURM_JOB_ID=424242 "));
  ASSERT_TRUE(first.wait_for_output("/2000 | loss", 120));
  const CliRun requeued = run(kTrain + "--train.steps=4 --checkpoint.every_steps=2 --checkpoint.lease_s=2 "
                                       "--checkpoint.dir=" + dir + " --log.run_dir=" + dir + "_requeued",
                              kNoSlurm + "SLURM_JOB_ID=424242 SLURM_RESTART_COUNT=1", 120);
  EXPECT_EQ(requeued.exit_code, 0) << requeued.err;
  EXPECT_NE(requeued.err.find("taking over checkpoint.dir " + dir + " from the run that held it: host "),
            std::string::npos)
      << requeued.err;
  EXPECT_NE(requeued.err.find("Slurm job 424242"), std::string::npos) << requeued.err;
  EXPECT_NE(requeued.err.find("the same Slurm job 424242 (a requeue)"), std::string::npos) << requeued.err;
  ASSERT_TRUE(first.wait_for_exit(60));
  EXPECT_EQ(first.exit_code(), 2) << first.output();
  EXPECT_NE(first.output().find("this run lost its lease on checkpoint.dir " + dir), std::string::npos)
      << first.output();
  EXPECT_EQ(read_manifest(dir + "/step_00000004").step, 4);
}

// (d) A folder that cannot take the lease: read-only, or full. Root writes through
// permissions, so both are made as mounts in a namespace of the test's own (unshare -rm:
// a read-only tmpfs, a full one); without that, a non-root user gets chmod; else skipped.
TEST(LeaseCli, AReadOnlyOrFullFolderIsOneErrorExit2) {
  const std::string dir = fresh_dir("cli_mount");
  fs::create_directories(dir);
  const bool namespaces = std::system("unshare -rm true >/dev/null 2>&1") == 0;
  if (!namespaces && getuid() == 0) GTEST_SKIP() << "root ignores permissions, and unshare -rm (to mount) is refused";
  struct Case {
    const char* name;
    std::string mount;  // shell commands run first in the namespace
    const char* error;
  };
  const std::vector<Case> cases = {
      {"read-only", "mount -t tmpfs -o ro,size=64k tmpfs " + dir, "Read-only file system"},
      {"full", "mount -t tmpfs -o size=16k tmpfs " + dir + " && (head -c 1048576 /dev/zero > " + dir + "/fill; true)",
       "No space left on device"},
  };
  for (const Case& c : cases) {
    if (!namespaces && std::string(c.name) == "full") continue;  // no way to fill a disk here
    std::string command;
    const std::string train = trident_bin() + " " + kTrain + "--train.steps=2 --checkpoint.dir=" + dir +
                              " --log.run_dir=" + testing::TempDir() + "lease_cli_mount_run";
    if (namespaces) {
      command = kNoSlurm + "unshare -rm sh -c '" + c.mount + " && exec " + train + "'";
    } else {
      fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
      command = kNoSlurm + train;
    }
    ChildProcess r(command);
    ASSERT_TRUE(r.wait_for_exit(60)) << c.name;
    if (!namespaces) fs::permissions(dir, fs::perms::owner_all);
    EXPECT_EQ(r.exit_code(), 2) << c.name << "\n" << r.output();
    EXPECT_EQ(count(r.output(), "trident: error:"), 1) << c.name << "\n" << r.output();
    EXPECT_NE(r.output().find("trident: error: cannot "), std::string::npos) << c.name << "\n" << r.output();
    EXPECT_NE(r.output().find("the lease on checkpoint.dir " + dir), std::string::npos) << c.name << "\n" << r.output();
    EXPECT_NE(r.output().find(namespaces ? c.error : "Permission denied"), std::string::npos) << c.name << "\n"
                                                                                               << r.output();
    EXPECT_EQ(r.output().find(" | loss"), std::string::npos) << c.name;
  }
}

}  // namespace
}  // namespace trident
