// The executable as a user meets it: exit codes, one clear message on bad input (on
// every rank, under mpirun too), verify's verdict, and a short training run whose loss
// falls well below the unigram entropy of its text.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace trident {
namespace {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trident_bin() {
  const char* bin = std::getenv("TRIDENT_BIN");
  return bin != nullptr ? bin : "build/trident";
}

// Runs `trident <args>` (under `launcher` if given) with a time limit.
CliRun run(const std::string& args, const std::string& launcher = "", int timeout_s = 120) {
  const std::string out = testing::TempDir() + "trident_cli.out", err = testing::TempDir() + "trident_cli.err";
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + launcher + " " + trident_bin() + " " +
                          args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) n++;
  return n;
}

TEST(Cli, VersionAndHelp) {
  const CliRun version = run("--version");
  EXPECT_EQ(version.exit_code, 0);
  for (const char* part : {"MPI: Open MPI", "HDF5: 1.", "BLAS: oneDNN", "CUDA:", "NCCL:"})
    EXPECT_NE(version.out.find(part), std::string::npos) << part << " in\n" << version.out;
  const CliRun help = run("train --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--train.lr"), std::string::npos);
  const CliRun verify_help = run("verify --help");
  EXPECT_EQ(verify_help.exit_code, 0);
  EXPECT_NE(verify_help.out.find("--reference"), std::string::npos);
}

TEST(Cli, BadInputExitsTwoWithOneMessage) {
  const std::string not_hdf5 = testing::TempDir() + "not_hdf5.h5";
  std::ofstream(not_hdf5) << "this is text";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no command"},
      {"fly", "unknown command 'fly'"},
      {"train --model.n_layers=3", "model.n_layers"},
      {"train --config /nonexistent.ini", "/nonexistent.ini"},
      {"train --train.lr=-0.1", "train.lr"},
      {"train --model.d_model=100 --model.n_head=3", "multiple of model.n_head"},
      {"train --data.path=/nonexistent/text", "/nonexistent/text"},
      {"verify", "reference"},
      {"verify --reference /nonexistent.h5", "/nonexistent.h5"},
      {"verify --reference " + not_hdf5, "not HDF5"},
      {"verify --reference tests/data/gpt2_ref_a.h5 --train.micro_batch=3", "must divide"},
  };
  for (const auto& [args, expected] : cases) {
    const CliRun r = run(args);
    EXPECT_EQ(r.exit_code, 2) << "trident " << args << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error:"), 1) << "trident " << args << "\n" << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << "trident " << args << "\n" << r.err;
  }
}

TEST(Cli, BadInputUnderMpirunEndsEveryRankWithTwo) {
  const std::string mpirun = "mpirun --oversubscribe --allow-run-as-root -np 2";
  const CliRun r = run("train --model.d_model=100 --model.n_head=3", mpirun, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(count(r.err, "trident: error:"), 1) << r.err;  // printed once, by rank 0
  EXPECT_NE(r.err.find("multiple of model.n_head"), std::string::npos) << r.err;
}

TEST(Cli, VerifyPassesTheShippedReference) {
  const CliRun r = run("verify --reference tests/data/gpt2_ref_a.h5");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\nPASS\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("h.3.mlp.c_proj.weight"), std::string::npos) << "per-tensor table missing";
}

TEST(Cli, ShortTrainingRunLearns) {
  const std::string run_dir = testing::TempDir() + "trident_train_run";
  const CliRun r = run("train --config configs/tiny.ini --train.steps=150 --train.warmup_steps=20 "
                    "--log.every_steps=50 --log.val_batches=2 --log.peak_gflops=100 --log.run_dir=" + run_dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("unigram entropy ([0-9.]+) nats"))) << r.out;
  const double entropy = std::stod(m[1]);
  EXPECT_GT(entropy, 3.0);  // English text, bytes: about 3.3 nats
  // Every logged step is in metrics.jsonl with the documented fields.
  std::ifstream jsonl(run_dir + "/metrics.jsonl");
  std::string line;
  double first = 0, last = 0, val = 0;
  int steps = 0;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      val = j["val_loss"];
      continue;
    }
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    (steps == 0 ? first : last) = j["loss"];
    steps++;
  }
  EXPECT_EQ(steps, 4);  // steps 1, 50, 100, 150
  EXPECT_GT(first, 5.0);  // about log(256) at initialization
  EXPECT_LT(last, entropy - 0.5) << "loss must fall well below the unigram entropy";
  EXPECT_GT(val, 0.0);
  EXPECT_LT(val, entropy - 0.3);
  EXPECT_NE(r.out.find("step 150/150 | loss"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace trident
