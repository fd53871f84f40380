// What cluster users run besides `train`: the MFU peak and its source, the run summary
// that sweeps collect, `doctor`, the sweep driver and its plots, `--help` as users read it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "health/health_verdict.h"
#include "tests/unit/machine.h"
#include "plan/device_peak.h"

namespace trident {

namespace fs = std::filesystem;
namespace {


TEST(ClusterTools, HelpShowsDefaultsAsUsersWriteThem) {
  const CliRun help = run("train --help");
  ASSERT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--model.norm_eps arg (=1e-05)"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--train.weight_decay arg (=0.1)"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("00000000"), std::string::npos) << help.out;
}

TEST(ClusterTools, DatasheetRatesOfTheGpusDriversName) {
  using kernels::Precision;
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA H200", Precision::bf16).gflops, 989400);
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA H100 80GB HBM3", Precision::bf16).gflops, 989400);
  EXPECT_EQ(datasheet_rate("NVIDIA H100 80GB HBM3", Precision::bf16).entry, "H100 SXM");
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA H100 PCIe", Precision::bf16).gflops, 756000);
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA H100 80GB HBM3", Precision::fp32).gflops, 66900);
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA A100-SXM4-80GB", Precision::bf16).gflops, 312000);
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA L4", Precision::bf16).gflops, 121000);
  EXPECT_DOUBLE_EQ(datasheet_rate("NVIDIA L40S", Precision::bf16).gflops, 362100);
  EXPECT_EQ(datasheet_rate("Tesla T4", Precision::bf16).gflops, 0);
  // The names as drivers print them, each to its own entry (a name containing another's
  // match must not be taken by it: a GH200 is not an H200 SXM).
  const std::vector<std::pair<std::string, std::string>> named = {
      {"NVIDIA GH200 480GB", "GH200"}, {"NVIDIA H200", "H200 SXM"},   {"NVIDIA H100 NVL", "H100 NVL"},
      {"NVIDIA H100 PCIe", "H100 PCIe"}, {"NVIDIA L40", "L40"},      {"NVIDIA L40S", "L40S"},
      {"NVIDIA L4", "L4"},             {"NVIDIA A10G", "A10G"}};
  for (const auto& [driver_name, entry] : named) EXPECT_EQ(datasheet_rate(driver_name, Precision::bf16).entry, entry);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// 4 ranks of one thread on this machine: the peak is one core's rate times the cores in
// use, min(4, cores); MFU and tokens/s in summary.json agree with the model's FLOPs.
TEST(ClusterTools, MfuPeakCountsTheCoresInUseAndTheSummaryAddsUp) {
  const std::string dir = testing::TempDir() + "summary_run";
  std::filesystem::remove_all(dir);
  const CliRun r = run("train --config configs/tiny.ini --parallel.tp=2 --parallel.pp=2 --train.global_batch=4 "
                       "--train.micro_batch=2 --train.steps=4 --log.val_batches=0 --log.run_dir=" + dir,
                       kMpirun + "4", 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const long cores = std::min(4L, sysconf(_SC_NPROCESSORS_ONLN));
  const std::string in_use = "x " + std::to_string(cores) + " cores in use";
  EXPECT_NE(r.out.find("MFU peak: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(in_use), std::string::npos) << r.out;
  const nlohmann::json s = read_json(dir + "/summary.json");
  EXPECT_EQ(s["ranks"], 4);
  EXPECT_EQ(s["tp"], 2);
  EXPECT_EQ(s["pp"], 2);
  EXPECT_EQ(s["steady_steps"], 3);
  EXPECT_NE(s["peak_source"].get<std::string>().find(in_use), std::string::npos);
  // The per-core rate printed in the source, times the cores, is the total.
  const std::string source = s["peak_source"];
  const double core = std::stod(source.substr(source.find("one core ") + 9));
  EXPECT_NEAR(s["peak_gflops"].get<double>(), core * static_cast<double>(cores), 0.1 * cores);
  const double tokens_per_step = 4.0 * 128;
  EXPECT_NEAR(s["tokens_per_s"].get<double>(), tokens_per_step / s["step_time_s"].get<double>(), 1e-6);
  // tiny.ini: 6 N + 12 L T d FLOPs per token, N without wpe (GPT-2 convention).
  const double n = s["parameters"].get<double>() - 128.0 * 128, flops = 6 * n + 12.0 * 4 * 128 * 128;
  EXPECT_NEAR(s["mfu"].get<double>(), s["tokens_per_s"].get<double>() * flops / (s["peak_gflops"].get<double>() * 1e9),
              1e-9);
  EXPECT_GT(s["mfu"].get<double>(), 0.0);
  EXPECT_LT(s["mfu"].get<double>(), 1.0);
  // 2 stages, 2 micro-batches: (p-1)/(m+p-1) = 1/3, and stage 0 did wait on its neighbour.
  EXPECT_DOUBLE_EQ(s["bubble_theory"].get<double>(), 1.0 / 3);
  EXPECT_GT(s["bubble"].get<double>(), 0.0);
  EXPECT_LT(s["bubble"].get<double>(), 1.0);
}

TEST(ClusterTools, DoctorChecksThisMachineAndNamesWhatFailed) {
  const std::string ckpt = testing::TempDir() + "doctor_ckpt";
  // A low bandwidth floor: the row's form is under test, and a loaded CI box misses the CPU default.
  // A mixture of experts over ep = 2: its token exchange timed, a micro-batch's dispatch
  // (8 sequences x 128 tokens x top-2 x d_model 128, fp32: 1 MiB a rank).
  const CliRun ok = run("doctor --config configs/tiny-mixtral.ini --parallel.ep=2 --expect_busbw=0.01 "
                        "--checkpoint.dir=" + ckpt, kMpirun + "2", 120);
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  const std::string host = health::node_name();
  const std::vector<std::string> rows = {"| ranks | ok | 2 ranks on 1 host(s)", "| MPI | ok | Open MPI",
                                         "| all-reduce node " + host + " | ok |", "| libfabric " + host + " |",
                                         "| EFA " + host + " | skip |",
                                         "| all-to-all ep | ok | groups of 2 ranks, 1.00 MiB a rank sends (micro_batch 8 "
                                         "x seq_len 128 x top-2 x d_model 128, fp32): busbw ",
                                         "| data | ok | text /usr/share/games/fortunes: ", "doctor: all checks passed"};
  for (const std::string& row : rows)
    EXPECT_NE(ok.out.find(row), std::string::npos) << row << " in\n" << ok.out;
  EXPECT_EQ(count(ok.out, "| checkpoint folder "), 1) << ok.out;  // one per node
  EXPECT_NE(ok.out.find("writable"), std::string::npos) << ok.out;
  if (test::machine_has_nvml()) EXPECT_NE(ok.out.find(" GPU(s)"), std::string::npos) << ok.out;  // its driver's view
  else EXPECT_NE(ok.out.find("| skip | libnvidia-ml.so.1 not found"), std::string::npos) << ok.out;

  // A folder that cannot be made, and a bandwidth no machine reaches: failed checks, exit 1.
  // Data that train would refuse: its refusal, word for word.
  const CliRun bad = run("doctor --checkpoint.dir=/proc/trident-doctor --expect_busbw=1000000 "
                         "--data.path=/nonexistent/data", kMpirun + "2", 120);
  EXPECT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("FAIL | /proc/trident-doctor: not writable"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("doctor: FAILED: checkpoint folder "), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("| data | FAIL | data.path '/nonexistent/data' does not exist |"), std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find(", data\n"), std::string::npos) << bad.out;  // named on the FAILED line
  EXPECT_NE(bad.out.find("| all-reduce node " + host + " | FAIL |"), std::string::npos) << bad.out;

  // The same bandwidth with a folder that takes files: the node's verdict for the batch
  // script (health/), naming it and what it failed.
  const std::string verdict_dir = testing::TempDir() + "doctor_verdict";
  fs::remove_all(verdict_dir);
  const CliRun slow = run("doctor --checkpoint.dir=" + verdict_dir + " --expect_busbw=1000000", kMpirun + "2", 120);
  EXPECT_EQ(slow.exit_code, 1) << slow.out << slow.err;
  const std::string path = health::verdict_path(verdict_dir);
  ASSERT_TRUE(fs::exists(path)) << slow.out << slow.err;
  const health::Verdict v = health::from_json(slurp(path));
  EXPECT_EQ(v.host, host);
  EXPECT_EQ(v.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(v.reason, "preflight failed: all-reduce node " + host) << v.reason;
  EXPECT_NE(v.evidence.find("busbw"), std::string::npos) << v.evidence;

  // A bad flag: one error, exit 2.
  const CliRun flag = run("doctor --expect_bw=3", kMpirun + "2", 60);
  EXPECT_EQ(flag.exit_code, 2) << flag.out << flag.err;
  EXPECT_EQ(count(flag.err, "trident: error:"), 1) << flag.err;
}

std::vector<std::string> csv_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// A grid with good points and two impossible ones (tp not dividing the heads, more ranks
// than the allocation): a row for each, the good ones measured, the run resumable; then
// the plots of its CSV.
TEST(ClusterTools, SweepRecordsEveryPointAndResumes) {
  if (std::system((kPython + " -c '' 2>/dev/null").c_str()) != 0) GTEST_SKIP() << "no " << kPython;
  const std::string dir = testing::TempDir() + "sweep/";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A config that names a checkpoint folder: each point must get one of its own, not
  // resume the point before it (and measure nothing).
  std::ofstream(dir + "saving.ini") << slurp("configs/tiny.ini") << "\n[checkpoint]\ndir = " << dir
                                    << "shared_ckpt\nevery_steps = 3\n";
  std::ofstream(dir + "grid") << "# test grid\nconfig = " << dir << "saving.ini\nlayout = 1x1x1 2x1x1 1x3x1 8x1x1\n"
                              << "global_batch = 8\nsteps = 3\nflags = --log.val_batches=0\n";
  const std::string sweep = without_mpi_environment() + " SLURM_NTASKS=4 OMPI_ALLOW_RUN_AS_ROOT=1 "
                            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 " + kPython + " benchmarks/sweep.py " + dir +
                            "grid --csv " + dir + "results.csv --build " + trident_bin().substr(0, trident_bin().rfind('/'));
  ASSERT_EQ(std::system((sweep + " > " + dir + "out1.txt 2>&1").c_str()), 0) << slurp(dir + "out1.txt");
  const std::vector<std::string> rows = csv_lines(dir + "results.csv");
  ASSERT_EQ(rows.size(), 5u) << slurp(dir + "out1.txt");  // header + 4 points
  EXPECT_EQ(rows[0].rfind("point,config,dp,tp,pp,ranks", 0), 0u) << rows[0];
  const auto row_of = [&](const std::string& layout) {
    for (const std::string& r : rows)
      if (r.find(" " + layout + " ") != std::string::npos) return r;
    return std::string();
  };
  EXPECT_NE(row_of("1x1x1").find(",ok,"), std::string::npos) << row_of("1x1x1");
  EXPECT_NE(row_of("2x1x1").find(",ok,"), std::string::npos) << row_of("2x1x1");
  EXPECT_NE(row_of("1x3x1").find(",failed,"), std::string::npos) << row_of("1x3x1");
  EXPECT_NE(row_of("1x3x1").find("exit 2: trident: error:"), std::string::npos) << row_of("1x3x1");
  EXPECT_NE(row_of("8x1x1").find("needs 8 ranks, the allocation has 4"), std::string::npos) << row_of("8x1x1");
  const std::string table = slurp(dir + "out1.txt");
  EXPECT_NE(table.find("| point | ranks | status | tokens/s | MFU |"), std::string::npos) << table;

  // Resumed: every point is in the CSV, nothing runs again.
  ASSERT_EQ(std::system((sweep + " > " + dir + "out2.txt 2>&1").c_str()), 0);
  EXPECT_NE(slurp(dir + "out2.txt").find("4 already in"), std::string::npos) << slurp(dir + "out2.txt");
  EXPECT_EQ(csv_lines(dir + "results.csv").size(), 5u);

  // The plots of that CSV.
  if (std::system((kPython + " -c 'import matplotlib' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "no matplotlib (python3-matplotlib): plots not made";
  }
  const std::string plot = kPython + " benchmarks/plot_sweep.py " + dir + "results.csv --out " + dir + " > " + dir +
                           "plot.txt 2>&1";
  ASSERT_EQ(std::system(plot.c_str()), 0) << slurp(dir + "plot.txt");
  for (const char* png : {"throughput.png", "scaling.png"}) {
    const std::string head = slurp(dir + png).substr(0, 8);
    EXPECT_EQ(head, "\x89PNG\r\n\x1a\n") << png;
  }
}

}  // namespace
}  // namespace trident
