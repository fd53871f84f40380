// Watching a run with the tools clusters use, each checked by a reader that is not ours:
// TensorBoard's event files decoded by the protobuf library (tests/monitor/read_tensorboard.py),
// the Prometheus endpoint scraped by a real Prometheus and linted by promtool, the GPU
// telemetry through NVML's calls filled by a stand-in GPU, the step trace as JSON, and
// the Grafana dashboard's queries against what is exported.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "cli_helpers.h"
#include "monitor/prometheus_exporter.h"
#include "monitor/run_metrics.h"
#include "monitor/telemetry.h"
#include "pipeline/schedule.h"
#include "train/metrics_log.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

const std::string kTiny = "train --config configs/tiny.ini --model.d_model=64 --model.n_layer=2 "
                          "--log.sample_every_steps=0 ";

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// What Debian's Python with python3-protobuf, python3-crc32c and protoc need to read the files.
bool have_tensorboard_readers() {
  return std::system((kPython + " -c 'import google.protobuf, crc32c' 2>/dev/null && command -v protoc >/dev/null").c_str()) == 0;
}

std::vector<nlohmann::json> read_events(const std::string& folder) {
  const std::string out = testing::TempDir() + "events.jsonl";
  const int status = std::system((kPython + " tests/monitor/read_tensorboard.py " + folder + " > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 0) << slurp(out);
  return json_lines(slurp(out));
}

// Each figure of metrics.jsonl's step and validation records, as TensorBoard holds it (a
// float32 simple_value) at the same step; how many times each tag was compared.
std::map<std::string, int> expect_events_match_the_log(const std::vector<nlohmann::json>& events,
                                                       const std::string& jsonl, int from_step,
                                                       int through_step = std::numeric_limits<int>::max()) {
  std::map<int64_t, std::map<std::string, double>> scalars;  // step -> tag -> value (the last file's wins)
  for (const auto& e : events)
    if (e.contains("scalars"))
      for (const auto& [tag, value] : e["scalars"].items()) scalars[e["step"].get<int64_t>()][tag] = value.get<double>();
  std::map<std::string, int> compared;
  for (const nlohmann::json& r : json_lines(slurp(jsonl))) {
    const int step = r["step"];
    if (step < from_step || step > through_step) continue;
    const auto& at = scalars[step];
    const auto compare = [&](const RunMetric& m) {
      if (m.tensorboard[0] == '\0' || !r.contains(m.key)) return;
      ASSERT_TRUE(at.count(m.tensorboard)) << "step " << step << ": no '" << m.tensorboard << "' in TensorBoard";
      EXPECT_EQ(static_cast<float>(r[m.key].get<double>()), static_cast<float>(at.at(m.tensorboard)))
          << m.tensorboard << " at step " << step;
      compared[m.tensorboard]++;
    };
    for (const RunMetric& m : kStepMetrics) compare(m);
    for (const RunMetric& m : kValidationMetrics) compare(m);
    for (const RunMetric& m : kMixtureOfExpertsMetrics) compare(m);
    if (r.contains("machines")) {
      const nlohmann::json& machine = r["machines"][0];
      const std::string tag = "host/" + machine["host"].get<std::string>() + "/cpu-utilization";
      if (!at.count(tag)) {
        ADD_FAILURE() << "step " << step << ": no '" << tag << "' in TensorBoard";
        continue;
      }
      EXPECT_EQ(static_cast<float>(machine["cpu_utilization"].get<double>()), static_cast<float>(at.at(tag)));
    }
  }
  return compared;
}

int total(const std::map<std::string, int>& compared) {
  int n = 0;
  for (const auto& [tag, count] : compared) n += count;
  return n;
}

// TensorBoard's files as TensorBoard's own writer makes them, read back with protobuf:
// the file name, the file-version event first, the config in the text plugin, every
// figure equal to metrics.jsonl's; a resumed run writes a new file whose SessionLog START
// at its first step tells TensorBoard to drop what the old one held from there.
TEST(Monitor, TensorBoardFilesReadByProtobufAreTheMetricsLog) {
  if (!have_tensorboard_readers()) GTEST_SKIP() << "no python3-protobuf, python3-crc32c or protoc";
  const std::string dir = testing::TempDir() + "tensorboard_run", ckpt = dir + "/ckpt";
  fs::remove_all(dir);
  const std::string run_flags = kTiny + "--log.every_steps=3 --log.val_every_steps=6 --log.val_batches=1 "
                                        "--checkpoint.every_steps=6 --checkpoint.dir=" + ckpt + " --log.run_dir=" + dir;
  const CliRun first = run(run_flags + " --train.steps=12");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::vector<nlohmann::json> events = read_events(dir + "/tensorboard");
  ASSERT_GT(events.size(), 5u);
  const std::string file = events[0]["file"];
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  EXPECT_TRUE(std::regex_match(file, std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host) +
                                                 "\\.[0-9]+\\.[0-9]+")))
      << file;
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(events[1]["session_log"], "START");
  EXPECT_EQ(events[1]["step"], 1);
  ASSERT_TRUE(events[2].contains("texts")) << events[2];
  EXPECT_EQ(events[2]["texts"]["config"]["plugin"], "text");
  EXPECT_NE(events[2]["texts"]["config"]["text"].get<std::string>().find("n_layer = 2"), std::string::npos);
  EXPECT_GT(total(expect_events_match_the_log(events, dir + "/metrics.jsonl", 0)), 20);
  std::set<std::string> tags;
  for (const auto& e : events)
    if (e.contains("scalars"))
      for (const auto& [tag, value] : e["scalars"].items()) tags.insert(tag);
  for (const char* megatron : {"lm loss", "learning-rate", "grad-norm", "iteration-time", "lm loss validation",
                               "lm loss validation ppl", "batch-size"})
    EXPECT_TRUE(tags.count(megatron)) << megatron;

  // Resumed at step 6 with a longer run: a second file, START at 7, the steps going on.
  const CliRun resumed = run(run_flags + " --train.steps=15 --checkpoint.load=" + ckpt + "/step_00000006");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  events = read_events(dir + "/tensorboard");
  std::set<std::string> files;
  for (const auto& e : events) files.insert(e["file"].get<std::string>());
  ASSERT_EQ(files.size(), 2u);
  std::vector<nlohmann::json> second;
  for (const auto& e : events)
    if (e["file"] != file) second.push_back(e);
  ASSERT_GT(second.size(), 3u);
  EXPECT_EQ(second[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(second[1]["session_log"], "START");
  EXPECT_EQ(second[1]["step"], 7);
  int64_t last = 0;
  for (const auto& e : second)
    if (e.contains("scalars")) {
      EXPECT_GE(e["step"].get<int64_t>(), 7) << e;
      last = std::max(last, e["step"].get<int64_t>());
    }
  EXPECT_EQ(last, 15);
  EXPECT_GT(total(expect_events_match_the_log(events, dir + "/metrics.jsonl", 7)), 20);
}

// ---- Prometheus ----------------------------------------------------------------------

// A TCP port nobody listens on now.
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  close(s);
  return ntohs(a.sin_port);
}

// GET path from 127.0.0.1:port; the body, or "" if nothing answered.
std::string http_get(int port, const std::string& path) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    send(s, request.data(), request.size(), MSG_NOSIGNAL);
    char buffer[65536];
    for (ssize_t n; (n = recv(s, buffer, sizeof buffer, 0)) > 0;) out.append(buffer, static_cast<size_t>(n));
  }
  close(s);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// A process of the test's own, in a process group it ends (and waits for) however the test ends.
class Background {
 public:
  explicit Background(const std::string& command, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", (command + " > " + log + " 2>&1").c_str(), nullptr);
      _exit(127);
    }
    setpgid(pid_, pid_);
  }
  Background(const Background&) = delete;
  ~Background() { stop(SIGKILL); }
  bool running() { return pid_ > 0 && waitpid(pid_, &status_, WNOHANG) == 0; }
  // Sends `signal` to its group and waits for it; its exit status.
  int stop(int signal) {
    if (pid_ <= 0) return status_;
    kill(-pid_, signal);
    waitpid(pid_, &status_, 0);
    pid_ = -1;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// Polls `ready` every 50 ms until it holds or `seconds` pass.
bool wait_for(const std::function<bool()>& ready, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ready();
}

// A real Prometheus scrapes a training run: the figures come back through its query API,
// labelled with the job, model and layout; promtool passes the exposition; a scraper that
// connects and never reads leaves the training going.
TEST(Monitor, PrometheusScrapesARunAndPromtoolPassesIt) {
  if (std::system("command -v prometheus >/dev/null && command -v promtool >/dev/null") != 0)
    GTEST_SKIP() << "no prometheus / promtool (Debian's prometheus)";
  const std::string dir = testing::TempDir() + "prometheus_run";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int metrics = free_port(), web = free_port();
  Background training(without_mpi_environment() + " SLURM_JOB_ID=4242 " + trident_bin() + " " + kTiny +
                          "--train.steps=100000 --log.every_steps=1 --log.val_batches=0 --log.run_dir=" + dir +
                          "/run --log.metrics_port=" + std::to_string(metrics),
                      dir + "/train.log");
  ASSERT_TRUE(wait_for([&] { return http_get(metrics, "/metrics").find("trident_step{") != std::string::npos; }, 120))
      << slurp(dir + "/train.log");
  const std::string exposition = http_get(metrics, "/metrics");
  EXPECT_NE(exposition.find("job_id=\"4242\""), std::string::npos) << exposition;
  EXPECT_NE(exposition.find("layout=\"dp1 tp1 pp1\""), std::string::npos) << exposition;
  EXPECT_NE(exposition.find("trident_host_cpu_utilization_ratio{"), std::string::npos) << exposition;
  EXPECT_EQ(http_get(metrics, "/"), "not found: this port serves /metrics only\n");
  std::ofstream(dir + "/exposition.txt") << exposition;
  const int lint = std::system(("promtool check metrics < " + dir + "/exposition.txt > " + dir + "/promtool.txt 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(lint), 0) << slurp(dir + "/promtool.txt");

  // A client that connects, asks nothing and reads nothing: the steps go on meanwhile.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(metrics));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const size_t logged = json_lines(slurp(dir + "/run/metrics.jsonl")).size();
  EXPECT_TRUE(wait_for([&] { return json_lines(slurp(dir + "/run/metrics.jsonl")).size() >= logged + 5; }, 30));
  close(silent);

  std::ofstream(dir + "/prometheus.yml") << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: trident\n"
                                            "    static_configs:\n      - targets: ['127.0.0.1:"
                                         << metrics << "']\n";
  Background prometheus("prometheus --config.file=" + dir + "/prometheus.yml --storage.tsdb.path=" + dir +
                            "/tsdb --web.listen-address=127.0.0.1:" + std::to_string(web),
                        dir + "/prometheus.log");
  // The event: the first sample of trident_step stored and queried back.
  nlohmann::json answer;
  const auto query = [&](const std::string& q) {
    const std::string body = http_get(web, "/api/v1/query?query=" + q);
    answer = body.empty() ? nlohmann::json() : nlohmann::json::parse(body, nullptr, false);
    return answer.is_object() && answer.value("status", "") == "success" && !answer["data"]["result"].empty();
  };
  ASSERT_TRUE(wait_for([&] { return query("trident_step"); }, 120)) << slurp(dir + "/prometheus.log");
  const nlohmann::json& series = answer["data"]["result"][0];
  EXPECT_EQ(series["metric"]["job_id"], "4242") << series;
  EXPECT_EQ(series["metric"]["job"], "trident") << series;  // Prometheus's own label for the scrape job
  EXPECT_GE(std::stod(series["value"][1].get<std::string>()), 1.0) << series;
  ASSERT_TRUE(query("trident_batch_size_sequences"));
  EXPECT_EQ(answer["data"]["result"][0]["value"][1], "16");
  ASSERT_TRUE(query("trident_host_memory_total_bytes"));
  EXPECT_GT(std::stod(answer["data"]["result"][0]["value"][1].get<std::string>()), 1e9);
  prometheus.stop(SIGTERM);
  const int status = training.stop(SIGKILL);
  (void)status;
}

// The value of `name`'s sample in a Prometheus text exposition (NaN if absent).
double sample_of(const std::string& exposition, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(exposition, m, std::regex("\n" + name + "\\{[^}]*\\} ([^ \n]+)"))) return NAN;
  return std::stod(m[1]);
}

// A mixture of experts' figures (kMixtureOfExpertsMetrics) as TensorBoard and Prometheus
// hold them: 2 ranks with ep 2 and a capacity factor (so that the all-to-all bytes and the
// dropped pairs are not 0), every tag compared with metrics.jsonl at least once; each
// scraped sample equal to the record of the step the exposition is at; promtool passes it.
TEST(Monitor, AMixtureOfExpertsFiguresReachTensorBoardAndPrometheus) {
  if (!have_tensorboard_readers()) GTEST_SKIP() << "no python3-protobuf, python3-crc32c or protoc";
  const std::string dir = testing::TempDir() + "moe_monitor";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int port = free_port();
  Background training(without_mpi_environment() + " " + kMpirun + "2 " + trident_bin() +
                          " train --config configs/tiny-mixtral.ini --model.d_model=64 --model.n_layer=2 "
                          "--model.moe_capacity_factor=1 --parallel.ep=2 --train.steps=100000 --log.every_steps=1 "
                          "--log.val_batches=0 --log.sample_every_steps=0 --log.run_dir=" + dir + "/run "
                          "--log.metrics_port=" + std::to_string(port),
                      dir + "/train.log");
  // The event: an exposition at step 3 or later, whose record metrics.jsonl holds.
  std::string exposition;
  nlohmann::json record;
  const auto scraped = [&] {
    exposition = http_get(port, "/metrics");
    const double step = sample_of(exposition, "trident_step");
    if (!(step >= 3)) return false;
    for (const nlohmann::json& r : json_lines(slurp(dir + "/run/metrics.jsonl")))
      if (r["step"] == static_cast<int>(step)) record = r;
    return !record.is_null();
  };
  ASSERT_TRUE(wait_for(scraped, 120)) << slurp(dir + "/train.log");
  for (const RunMetric& m : kMixtureOfExpertsMetrics) {
    ASSERT_TRUE(record.contains(m.key)) << m.key << " " << record;
    // Within 4 ulps: prometheus-cpp writes 16 significant digits, one short of a round trip.
    EXPECT_DOUBLE_EQ(sample_of(exposition, m.prometheus), record[m.key].get<double>()) << m.prometheus << "\n" << exposition;
  }
  EXPECT_GT(record["all_to_all_bytes"].get<double>(), 0.0);
  EXPECT_GT(record["tokens_dropped"].get<double>(), 0.0);
  EXPECT_GT(record["expert_load"].get<double>(), 1.0);
  if (std::system("command -v promtool >/dev/null") == 0) {
    std::ofstream(dir + "/exposition.txt") << exposition;
    const int lint = std::system(("promtool check metrics < " + dir + "/exposition.txt > " + dir + "/promtool.txt 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(lint), 0) << slurp(dir + "/promtool.txt");
  }
  training.stop(SIGTERM);
  // The steps TensorBoard holds (a stop between a step's record in metrics.jsonl and its
  // events leaves that step out of TensorBoard), past the scraped one.
  const std::vector<nlohmann::json> events = read_events(dir + "/run/tensorboard");
  int last = 0;
  for (const auto& e : events)
    if (e.contains("scalars")) last = std::max(last, e["step"].get<int>());
  ASSERT_GE(last, record["step"].get<int>());
  const std::map<std::string, int> compared =
      expect_events_match_the_log(events, dir + "/run/metrics.jsonl", 0, last);
  for (const RunMetric& m : kMixtureOfExpertsMetrics) EXPECT_GE(compared.count(m.tensorboard) ? compared.at(m.tensorboard) : 0, 1) << m.tensorboard;
}

// A mixture of experts' step as rank 0 logs it: the dropped pairs as a share of the routed
// ones on the line; the tokens per expert (summed over the layers, and per layer when
// asked) in metrics.jsonl and as one TensorBoard scalar per expert.
TEST(Monitor, AMixtureOfExpertsStepShowsItsDropsAsAShareAndTokensPerExpert) {
  const std::string dir = testing::TempDir() + "moe_step_log";
  fs::remove_all(dir);
  StepMetrics m;
  m.step = m.total_steps = 1;
  m.aux_loss = 0.01;
  m.expert_load = {1.5, 1.25};
  m.tokens_routed = 4096;
  m.tokens_dropped = 2243;
  m.expert_tokens_per_layer = {{1000, 500, 300, 248}, {900, 600, 400, 148}};
  m.expert_tokens = {1900, 1100, 700, 396};
  {
    MetricsLog log(dir, 0, dir + "/tensorboard");
    testing::internal::CaptureStdout();
    log.log_step(m);
    const std::string line = testing::internal::GetCapturedStdout();
    EXPECT_NE(line.find(" | aux 0.0100 | dropped 2243 of 4096 (55%) | lr "), std::string::npos) << line;
  }
  const std::vector<nlohmann::json> records = json_lines(slurp(dir + "/metrics.jsonl"));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["tokens_routed"], 4096);
  EXPECT_EQ(records[0]["tokens_dropped"], 2243);
  EXPECT_EQ(records[0]["expert_tokens"], nlohmann::json({1900, 1100, 700, 396}));
  EXPECT_EQ(records[0]["expert_tokens_per_layer"][1], nlohmann::json({900, 600, 400, 148}));
  // The tags are in the event file as they are written (protobuf strings).
  std::string events;
  for (const auto& f : fs::directory_iterator(dir + "/tensorboard")) events += slurp(f.path().string());
  for (const std::string tag : {"moe/expert-tokens/expert-0", "moe/expert-tokens/expert-3",
                                "moe/expert-tokens/layer-1/expert-3", "moe/tokens-routed"})
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  EXPECT_EQ(events.find("moe/expert-tokens/expert-4"), std::string::npos);
}

// A port in use, a port out of range, a TensorBoard folder that cannot be made, a bad
// trace range: one error each, exit 2, before training.
TEST(Monitor, BadInputIsOneErrorBeforeTraining) {
  const int port = free_port();
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  listen(held, 1);
  const std::string base = kTiny + "--train.steps=2 --log.val_batches=0 --log.run_dir=" + testing::TempDir() + "bad_monitor ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--log.metrics_port=" + std::to_string(port), "log.metrics_port " + std::to_string(port) + " cannot be served"},
      {"--log.metrics_port=70000", "log.metrics_port must be a TCP port"},
      {"--log.tensorboard_dir=/proc/trident_tb", "cannot make the TensorBoard folder '/proc/trident_tb'"},
      {"--log.trace_steps=5:2", "log.trace_steps must be A:B"},
      {"--log.trace_steps=2:9", "log.trace_steps ends at step 9, past train.steps (2)"},
  };
  for (const auto& [flags, message] : cases) {
    // Under mpirun where only rank 0 meets the problem (its port, its folder): said once, every rank exits 2.
    const bool rank0_alone = flags.find("trace_steps") == std::string::npos && flags.find("70000") == std::string::npos;
    const CliRun r = run(base + flags, rank0_alone ? kMpirun + "2" : "", 120);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error:"), 1) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << "\n" << r.err;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << flags << ": trained";
  }
  close(held);
}

// ---- GPU telemetry through NVML's calls, a stand-in GPU filling them -------------------

struct FakeGpu {
  unsigned utilization = 77, temperature = 64, milliwatts = 512345, sm_mhz = 1980;
  unsigned long long used = 30ull << 30, total = 141ull << 30, ecc = 0, throttle = 0x4;
};
FakeGpu fake_gpus[2];
std::vector<unsigned long long> pending_xids[2];
NvmlDevice* device(int i) { return reinterpret_cast<NvmlDevice*>(&fake_gpus[i]); }
int index_of(NvmlDevice* d) { return d == device(0) ? 0 : 1; }
NvmlEventSet* const kEvents = reinterpret_cast<NvmlEventSet*>(&pending_xids);

NvmlApi fake_nvml() {
  NvmlApi api;
  api.init = [] { return nvml::kSuccess; };
  api.shutdown = [] { return nvml::kSuccess; };
  api.device_count = [](unsigned* n) { return *n = 2, nvml::kSuccess; };
  api.handle_by_index = [](unsigned i, NvmlDevice** d) { return *d = device(static_cast<int>(i)), nvml::kSuccess; };
  api.name = [](NvmlDevice*, char* text, unsigned n) { return std::snprintf(text, n, "NVIDIA H200"), nvml::kSuccess; };
  api.uuid = [](NvmlDevice* d, char* text, unsigned n) {
    return std::snprintf(text, n, "GPU-0000-%d", index_of(d)), nvml::kSuccess;
  };
  api.memory = [](NvmlDevice* d, NvmlMemory* m) {
    const FakeGpu& g = fake_gpus[index_of(d)];
    return *m = {g.total, g.total - g.used, g.used}, nvml::kSuccess;
  };
  api.utilization = [](NvmlDevice* d, NvmlUtilization* u) {
    return *u = {fake_gpus[index_of(d)].utilization, 10}, nvml::kSuccess;
  };
  api.temperature = [](NvmlDevice* d, int, unsigned* c) { return *c = fake_gpus[index_of(d)].temperature, nvml::kSuccess; };
  api.power = [](NvmlDevice* d, unsigned* mw) { return *mw = fake_gpus[index_of(d)].milliwatts, nvml::kSuccess; };
  api.clock = [](NvmlDevice* d, int, unsigned* mhz) { return *mhz = fake_gpus[index_of(d)].sm_mhz, nvml::kSuccess; };
  api.throttle_reasons = [](NvmlDevice* d, unsigned long long* r) {
    return *r = fake_gpus[index_of(d)].throttle, nvml::kSuccess;
  };
  api.ecc_mode = [](NvmlDevice*, int* current, int* pending) { return *current = *pending = 1, nvml::kSuccess; };
  api.ecc_errors = [](NvmlDevice* d, int, int, unsigned long long* n) {
    return *n = fake_gpus[index_of(d)].ecc, nvml::kSuccess;
  };
  api.event_set_create = [](NvmlEventSet** s) { return *s = kEvents, nvml::kSuccess; };
  api.register_events = [](NvmlDevice*, unsigned long long, NvmlEventSet*) { return nvml::kSuccess; };
  api.event_set_wait = [](NvmlEventSet*, NvmlEventData* e, unsigned) {
    for (int i = 0; i < 2; i++)
      if (!pending_xids[i].empty()) {
        *e = {device(i), nvml::kXidCriticalError, pending_xids[i].front(), 0, 0};
        pending_xids[i].erase(pending_xids[i].begin());
        return nvml::kSuccess;
      }
    return nvml::kTimeout;
  };
  api.event_set_free = [](NvmlEventSet*) { return nvml::kSuccess; };
  return api;
}

TEST(Telemetry, GpusThroughNvmlsCallsTheirXidsAndEccWarnedAndServedUnderDcgmNames) {
  MachineTelemetry telemetry(fake_nvml());
  MachineSample s = telemetry.sample();
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpus[1].name, "NVIDIA H200");
  EXPECT_EQ(s.gpus[1].uuid, "GPU-0000-1");
  EXPECT_DOUBLE_EQ(s.gpus[0].utilization, 77);
  EXPECT_DOUBLE_EQ(s.gpus[0].memory_used_mib, 30 * 1024);
  EXPECT_DOUBLE_EQ(s.gpus[0].memory_total_mib, 141 * 1024);
  EXPECT_DOUBLE_EQ(s.gpus[0].power_w, 512.345);
  EXPECT_DOUBLE_EQ(s.gpus[0].temperature_c, 64);
  EXPECT_DOUBLE_EQ(s.gpus[0].sm_clock_mhz, 1980);
  EXPECT_EQ(s.gpus[0].throttle_reasons, 0x4u);
  EXPECT_TRUE(telemetry.warnings().empty());
  EXPECT_GE(s.cpu_utilization, 0.0);
  EXPECT_LE(s.cpu_utilization, 1.0);
  EXPECT_GT(s.memory_total_gib, 0.1);

  // GPU 1 reports XID 79 (fallen off the bus) and an uncorrected ECC error.
  pending_xids[1] = {79};
  fake_gpus[1].ecc = 1;
  s = telemetry.sample();
  EXPECT_EQ(s.gpus[1].xid_errors, 1u);
  EXPECT_EQ(s.gpus[1].last_xid, 79u);
  EXPECT_EQ(s.gpus[0].xid_errors, 0u);
  ASSERT_EQ(telemetry.warnings().size(), 2u);
  EXPECT_NE(telemetry.warnings()[0].find("GPU 1 (NVIDIA H200): 1 XID error(s), the last XID 79"), std::string::npos)
      << telemetry.warnings()[0];
  EXPECT_NE(telemetry.warnings()[1].find("GPU 1 (NVIDIA H200): uncorrected ECC errors 0 -> 1"), std::string::npos)
      << telemetry.warnings()[1];
  telemetry.sample();
  EXPECT_TRUE(telemetry.warnings().empty()) << "warned once, not at every sample";
  EXPECT_EQ(machine_sample_from_json(to_json(s)).gpus[1].last_xid, 79u);

  // Served as DCGM's exporter names them, labelled as it labels them.
  const int port = free_port();
  PrometheusExporter exporter(port, {{"job_id", "7"}});
  exporter.set_machine(s);
  const std::string page = http_get(port, "/metrics");
  const std::string gpu1 = "job_id=\"7\",gpu=\"1\",UUID=\"GPU-0000-1\",device=\"nvidia1\",modelName=\"NVIDIA H200\",Hostname=\"" +
                           s.host + "\"}";
  for (const std::string& line : {"DCGM_FI_DEV_GPU_UTIL{" + gpu1 + " 77", "DCGM_FI_DEV_XID_ERRORS{" + gpu1 + " 79",
                                  "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{" + gpu1 + " 1", "DCGM_FI_DEV_POWER_USAGE{" + gpu1 + " 512.345",
                                  "DCGM_FI_DEV_FB_USED{" + gpu1 + " 30720", "trident_gpu_xid_errors_total{" + gpu1 + " 1"})
    EXPECT_NE(page.find(line), std::string::npos) << line << "\n" << page;
  // promtool's lint passes it but for DCGM's own camelCase label (modelName), which
  // dcgm-exporter's pages carry too and dashboards use: that is the one complaint.
  if (std::system("command -v promtool >/dev/null") == 0) {
    const std::string file = testing::TempDir() + "gpu_page.prom", lint = testing::TempDir() + "gpu_lint.txt";
    std::ofstream(file) << page;
    std::system(("promtool check metrics < " + file + " > " + lint + " 2>&1").c_str());
    std::istringstream complaints(slurp(lint));
    int lines = 0;
    for (std::string c; std::getline(complaints, c);) {
      if (c.empty()) continue;
      lines++;
      EXPECT_NE(c.find("label names should be written in 'snake_case' not 'camelCase'"), std::string::npos) << c;
    }
    EXPECT_GT(lines, 0) << "modelName is DCGM's camelCase label";
  }
}

// ---- the step trace --------------------------------------------------------------------

// Two steps of a 1F1B run at pp 2 with 4 micro-batches, as Chrome's trace JSON: both ranks
// there, every layer's span inside a micro-batch's, and stage 0's forwards and backwards
// in the schedule's warmup / steady / cooldown order.
TEST(Monitor, AStepTraceShowsEveryRankAndThePipelineSchedule) {
  const std::string dir = testing::TempDir() + "trace_run";
  fs::remove_all(dir);
  const CliRun r = run(kTiny + "--parallel.pp=2 --train.global_batch=8 --train.micro_batch=2 --train.steps=3 "
                               "--log.val_batches=0 --log.trace_steps=2:3 --log.run_dir=" + dir,
                       kMpirun + "2", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string path = dir + "/trace_steps_2-3.json";
  EXPECT_NE(r.out.find("trace of steps 2:3 written to " + path), std::string::npos) << r.out;
  const nlohmann::json trace = nlohmann::json::parse(slurp(path));
  std::map<int, std::vector<nlohmann::json>> spans;  // per rank, complete events in time order
  std::set<int> named;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int>());
    if (e["ph"] == "X") spans[e["pid"].get<int>()].push_back(e);
  }
  EXPECT_EQ(named, (std::set<int>{0, 1}));
  for (auto& [rank, events] : spans)
    std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) { return a["ts"] < b["ts"]; });
  // Every layer span lies inside a micro-batch's forward or backward of its rank.
  for (const auto& [rank, events] : spans)
    for (const auto& layer : events) {
      if (layer["cat"] != "layer") continue;
      const double begin = layer["ts"], end = begin + layer["dur"].get<double>();
      bool inside = false;
      for (const auto& mb : events)
        if (mb["cat"] == "pipeline" && mb["ts"].get<double>() <= begin &&
            mb["ts"].get<double>() + mb["dur"].get<double>() >= end)
          inside = true;
      EXPECT_TRUE(inside) << "rank " << rank << ": " << layer;
    }
  // Stage 0, one step: what the schedule says, in its order (two steps recorded).
  std::vector<std::string> order;
  for (const auto& e : spans[0])
    if (e["cat"] == "pipeline") order.push_back(e["name"]);
  std::vector<std::string> want;
  for (const PipelineAction& a : stage_actions(Schedule::one_f_one_b, 0, 2, 4))
    want.push_back(std::string(a.kind == PipelineAction::forward ? "forward" : "backward") + " mb " +
                   std::to_string(a.micro_batch));
  ASSERT_EQ(order.size(), 2 * want.size());
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + static_cast<long>(want.size())), want);
  // The communication that rank 0 waited for, with its group.
  bool pipeline_wait = false;
  for (const auto& e : spans[0]) pipeline_wait |= e["cat"] == "communication" && e["name"] == "recv pp";
  EXPECT_TRUE(pipeline_wait);
}

// ---- the dashboard ---------------------------------------------------------------------

TEST(Monitor, TheGrafanaDashboardQueriesOnlyWhatIsExported) {
  const nlohmann::json dashboard = nlohmann::json::parse(slurp("slurm/grafana/trident.json"));
  const std::vector<std::string> exported = exported_metric_names();
  const std::set<std::string> known(exported.begin(), exported.end());
  const std::regex metric("\\b(trident_[a-z_]+|DCGM_FI_[A-Z_]+)\\b");
  int queries = 0;
  for (const auto& panel : dashboard["panels"])
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"];
      queries++;
      for (std::sregex_iterator it(expr.begin(), expr.end(), metric), end; it != end; ++it)
        EXPECT_TRUE(known.count((*it)[1].str())) << (*it)[1].str() << " in '" << expr << "' is not exported";
    }
  EXPECT_GT(queries, 15);
  for (const char* figure : {"trident_loss", "trident_tokens_per_second", "trident_mfu_ratio", "trident_step_time_seconds",
                             "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS",
                             "trident_seconds_since_last_step", "trident_goodput_ratio",
                             "trident_goodput_restart_seconds"})
    EXPECT_NE(dashboard.dump().find(figure), std::string::npos) << figure << " has no panel";
}

}  // namespace
}  // namespace trident
