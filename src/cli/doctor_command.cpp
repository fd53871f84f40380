#include "cli/doctor_command.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "ckpt/remote_checkpoints.h"
#include "health/health_verdict.h"
#include "cli/system_probes.h"
#include "config/config.h"
#include "data/s3_data.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/transformer_spec.h"
#include "parallel/parallel_state.h"
#include "runtime/byte_size.h"
#include "kernels/base/error.h"
#include "optim/optimizer.h"
#include "runtime/timer.h"
#include "train/setup.h"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace trident {

namespace {

constexpr const char* kUsage =
    "usage: [mpirun -np N | srun] trident doctor [--config FILE.ini] [--checkpoint.dir=DIR] [--device=cuda]\n"
    "                                    [--checkpoint.upload=s3://bucket/prefix]\n"
    "                                    [--expect_busbw GB/s]\n"
    "\n"
    "The preflight before a long job: ranks and hosts as MPI sees them; per GPU its model,\n"
    "driver, memory and ECC state (NVML); NCCL and its network plugin (aws-ofi-nccl);\n"
    "libfabric's providers (efa, FI_HMEM); the EFA environment against slurm/efa_env.sh;\n"
    "a timed all-reduce on each group of the config's layout against --expect_busbw (and with\n"
    "a mixture of experts over parallel.ep > 1, a timed all-to-all of one micro-batch's dispatch\n"
    "on each ep group); the data as train opens it (s3:// entries listed and their indexes read,\n"
    "nothing copied), checked against the model; the checkpoint folder writable with room\n"
    "for a checkpoint of the config's model; with\n"
    "checkpoint.upload, from every node the bucket reachable and a probe object written,\n"
    "read back and deleted.\n"
    "One table on rank 0; exit 0, or 1 naming each failed check. What this machine lacks\n"
    "(no GPU, no EFA) is listed as skipped, with why.\n";

enum class Verdict { ok, fail, skip };

struct Check {
  Check() = default;
  Check(std::string n, Verdict v, std::string d) : name(std::move(n)), verdict(v), detail(std::move(d)) {}
  std::string name;
  Verdict verdict = Verdict::ok;
  std::string detail;
  std::string host;  // the node a failure is that of ("": the job's, not one node's)
};

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char text[256];
  std::snprintf(text, sizeof text, fmt, a, b, c);
  return text;
}

std::string hostname() { return health::node_name(); }

// A node's check: named after the node, and the node's if it fails.
Check on_this_node(Check c) {
  c.host = hostname();
  if (c.name.size() < c.host.size() || c.name.compare(c.name.size() - c.host.size(), c.host.size(), c.host) != 0)
    c.name += " " + c.host;
  return c;
}

// A check as one line "verdict|host|name|detail", for gathering.
std::string encode(const Check& c) {
  return std::to_string(static_cast<int>(c.verdict)) + "|" + c.host + "|" + c.name + "|" + c.detail;
}
Check decode(const std::string& line) {
  Check c;
  const size_t a = line.find('|'), b = line.find('|', a + 1), d = line.find('|', b + 1);
  c.verdict = static_cast<Verdict>(std::stoi(line.substr(0, a)));
  c.host = line.substr(a + 1, b - a - 1);
  c.name = line.substr(b + 1, d - b - 1);
  c.detail = line.substr(d + 1);
  return c;
}

Check ranks_check(Communicator& world, const std::vector<std::string>& hosts) {
  std::map<std::string, int> per_host;
  for (const std::string& h : hosts) per_host[h]++;
  std::string detail = std::to_string(world.size()) + " ranks on " + std::to_string(per_host.size()) + " host(s):";
  int lowest = world.size(), highest = 0;
  for (const auto& [h, n] : per_host) {
    detail += " " + h + " " + std::to_string(n);
    lowest = std::min(lowest, n);
    highest = std::max(highest, n);
  }
  Check c{"ranks", Verdict::ok, detail};
  if (lowest != highest) {
    c.verdict = Verdict::fail;
    c.detail += " (uneven: node-local groups and per-node checkpoint files expect the same count on every node)";
  }
  return c;
}

// On each node's first rank: its GPUs (NVML), against the ranks that will use them.
Check gpus_check(int ranks_on_node, bool cuda) {
  const GpuProbe p = probe_gpus();
  Check c{"GPUs " + hostname(), Verdict::ok, ""};
  if (!p.available) {
    c.verdict = cuda ? Verdict::fail : Verdict::skip;
    c.detail = p.why_not;
    return c;
  }
  c.detail = "driver " + p.driver + ", " + std::to_string(p.gpus.size()) + " GPU(s)";
  for (const GpuInfo& g : p.gpus) {
    c.detail += "; " + std::to_string(g.index) + ": " + g.name +
                format(" %.0f GiB (%.1f used)", g.memory_gib, g.memory_used_gib) +
                (g.ecc_enabled ? ", ECC on, " + std::to_string(g.ecc_uncorrected) + " uncorrected errors" : ", ECC off");
    if (g.ecc_uncorrected > 0) c.verdict = Verdict::fail;
  }
  if (cuda && static_cast<int>(p.gpus.size()) < ranks_on_node) {
    c.verdict = Verdict::fail;
    c.detail += "; fewer GPUs than the node's " + std::to_string(ranks_on_node) + " ranks";
  }
  return c;
}

// What slurm/efa_env.sh exports when it finds EFA: "export NAME=VALUE" inside its `if`.
std::map<std::string, std::string> efa_env_expected(std::string& source) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  source = (exe.parent_path().parent_path() / "slurm" / "efa_env.sh").string();
  std::ifstream in(source);
  std::map<std::string, std::string> want;
  const std::regex line(R"(^\s+export\s+([A-Z_0-9]+)=([^\s#]+))");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) want[m[1]] = m[2];
  }
  return want;
}

std::vector<Check> fabric_checks(bool cuda) {
  std::vector<Check> out;
  const LibraryProbe nccl = probe_nccl();
  out.push_back({"NCCL", nccl.found ? Verdict::ok : (cuda ? Verdict::fail : Verdict::skip),
                 nccl.found ? nccl.version + " (" + nccl.path + ")" : nccl.path + " not found"});
  const FabricProbe f = probe_fabric();
  if (!f.available) {
    out.push_back({"libfabric", Verdict::skip, f.why_not});
  } else {
    std::string providers;
    for (const std::string& p : f.providers) providers += (providers.empty() ? "" : ", ") + p;
    out.push_back({"libfabric", Verdict::ok, f.version + ": providers " + providers});
  }
  const LibraryProbe plugin = probe_nccl_net_plugin();
  if (!f.efa) {
    out.push_back({"EFA", Verdict::skip, "no efa provider (not an EFA instance)"});
    out.push_back({"NCCL net plugin", plugin.found ? Verdict::ok : Verdict::skip,
                   plugin.found ? plugin.path : plugin.path + " not found (needed on EFA only)"});
    out.push_back({"EFA environment", Verdict::skip, "no EFA: slurm/efa_env.sh sets nothing"});
    return out;
  }
  out.push_back({"EFA", f.efa_hmem ? Verdict::ok : Verdict::fail,
                 f.efa_hmem ? "efa provider with FI_HMEM (GPUDirect RDMA)" : "efa provider without FI_HMEM"});
  out.push_back({"NCCL net plugin", plugin.found ? Verdict::ok : Verdict::fail,
                 plugin.found ? plugin.path : plugin.path + " not found: NCCL would use TCP sockets, not EFA"});
  std::string source;
  const auto want = efa_env_expected(source);
  Check env{"EFA environment", Verdict::ok, ""};
  if (want.empty()) {
    env.verdict = Verdict::fail;
    env.detail = "cannot read the expected values from " + source;
  }
  for (const auto& [name, value] : want) {
    const char* have = std::getenv(name.c_str());
    if (have != nullptr && value == have) continue;
    env.verdict = Verdict::fail;
    env.detail += (env.detail.empty() ? "" : ", ") + name + "=" + (have ? have : "(unset)") + " (want " + value + ")";
  }
  if (env.verdict == Verdict::ok) env.detail = std::to_string(want.size()) + " variables as " + source + " sets them";
  else env.detail += ": source slurm/efa_env.sh";
  out.push_back(env);
  return out;
}

// All groups of one kind (e.g. every dp group) reduce at once, as in training; the
// slowest instance counts. Host memory for world and node (MPI), device memory else.
Check all_reduce_check(Communicator& group, Communicator& world, kernels::Kernels& k, bool device_memory,
                       double expect_gbps) {
  Check c{"all-reduce " + group.name(), Verdict::ok, ""};
  const size_t count = device_memory && k.name().rfind("cuda", 0) == 0 ? (64u << 20) : (4u << 20);
  std::vector<float> host;
  float* data = nullptr;
  if (device_memory) data = static_cast<float*>(k.alloc(count * sizeof(float)));
  else {
    host.assign(count, 1.0f);
    data = host.data();
  }
  std::span<float> span(data, count);
  constexpr int kIters = 5;
  group.all_reduce(span);  // warm-up: connections, buffers
  k.synchronize();
  world.barrier();
  Timer timer;
  for (int i = 0; i < kIters; i++) group.all_reduce_async(span)->wait();
  k.synchronize();
  const double seconds = world.all_reduce(timer.seconds() / kIters, ReduceOp::max);
  if (device_memory) k.free(data);
  const double n = group.size(), bytes = static_cast<double>(count) * sizeof(float);
  const double busbw = bytes / seconds * 2 * (n - 1) / n / 1e9;
  c.detail = format("groups of %.0f ranks, %.0f MiB: busbw %.2f GB/s", n, bytes / (1 << 20), busbw) +
             format(" (expected >= %.2f, --expect_busbw)", expect_gbps);
  if (busbw < expect_gbps) c.verdict = Verdict::fail;
  return c;
}

// Mixture of experts over ep > 1 ranks: each ep group exchanges a layer's dispatch of one
// micro-batch (micro_batch x seq_len tokens, each to its top-k experts: rows of d_model
// activations), spread evenly over the group, all groups at once as in training; the
// slowest counts. Bus bandwidth as nccl-tests counts an all-to-all's: (n-1)/n of the
// bytes a rank sends, over the time.
Check all_to_all_check(Communicator& ep_group, Communicator& world, kernels::Kernels& k, const Config& config,
                       double expect_gbps) {
  const TransformerSpec spec = transformer_spec(config.model);
  const kernels::DType type = config.train.resolved_precision() == kernels::Precision::bf16 && k.name().rfind("cuda", 0) == 0
                                  ? kernels::DType::bf16
                                  : kernels::DType::f32;
  const size_t n = static_cast<size_t>(ep_group.size());
  const size_t rows = static_cast<size_t>(config.train.micro_batch) * config.model.seq_len * spec.experts_per_token;
  const size_t per_peer = std::max<size_t>(1, rows * config.model.d_model / n);
  const size_t count = per_peer * n, bytes = count * kernels::dtype_bytes(type);
  auto* send = static_cast<kernels::Act*>(k.alloc(bytes));
  auto* recv = static_cast<kernels::Act*>(k.alloc(bytes));
  k.fill_zero(send, bytes);
  const std::vector<size_t> counts(n, per_peer);
  constexpr int kIters = 5;
  ep_group.all_to_all_v({send, count, type}, counts, {recv, count, type}, counts);  // warm-up: connections
  k.synchronize();
  world.barrier();
  const Timer timer;
  for (int i = 0; i < kIters; i++) ep_group.all_to_all_v({send, count, type}, counts, {recv, count, type}, counts);
  k.synchronize();
  const double seconds = world.all_reduce(timer.seconds() / kIters, ReduceOp::max);
  k.free(send);
  k.free(recv);
  const double busbw = static_cast<double>(bytes) / seconds * static_cast<double>(n - 1) / static_cast<double>(n) / 1e9;
  Check c{"all-to-all ep", Verdict::ok, ""};
  c.detail = format("groups of %.0f ranks, %.2f MiB a rank sends", static_cast<double>(n), bytes / double(1 << 20)) +
             " (micro_batch " + std::to_string(config.train.micro_batch) + " x seq_len " +
             std::to_string(config.model.seq_len) + " x top-" + std::to_string(spec.experts_per_token) + " x d_model " +
             std::to_string(config.model.d_model) + (type == kernels::DType::bf16 ? ", bf16" : ", fp32") + ")" +
             format(": busbw %.2f GB/s (expected >= %.2f, --expect_busbw)", busbw, expect_gbps);
  if (busbw < expect_gbps) c.verdict = Verdict::fail;
  return c;
}

// The data as train opens it, without copying any: its s3:// entries listed and their
// indexes read (data/s3_data.h), every entry opened (open_training_data) and checked
// against the model (require_data_fits). Train's refusal, said before the job.
Check data_check(const Config& config) {
  const DataConfig& d = config.data;
  try {
    const ListedData listed = list_s3_data(config);
    std::string s3;
    if (listed.objects > 0)
      s3 = "; s3:// " + std::to_string(listed.objects) + " objects, " + byte_size(listed.bytes) + " listed";
    if (!listed.listed_only.empty()) {
      std::string names;
      for (const std::string& e : listed.listed_only) names += (names.empty() ? "" : ", ") + e;
      // Shards and text are read once train has copied them: listed here, not opened.
      return {"data", Verdict::ok, "listed, not opened (train copies them first): " + names + s3};
    }
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(d.tokenizer, d.tokenizer_path);
    const TrainingData data =
        open_training_data(d.path, d.val_path, d.val_fraction, *tokenizer, d.json_key, listed.open_remote);
    require_data_fits(data, config.model.vocab_size, config.model.seq_len);
    return {"data", Verdict::ok,
            data.description + "; " + std::to_string(data.train.tokens()) + " train / " +
                std::to_string(data.val.tokens()) + " val tokens, ids below model.vocab_size" + s3};
  } catch (const std::exception& e) {
    return {"data", Verdict::fail, e.what()};
  }
}

// On each node's first rank: the folder writable (a file written, synced, removed) and
// its free space against one checkpoint of the model (fp32 parameters and the optimizer's
// state buffers).
Check checkpoint_dir_check(const std::string& dir, const Config& config) {
  Check c{"checkpoint folder " + hostname(), Verdict::ok, ""};
  if (dir.empty()) return {c.name, Verdict::skip, "no --checkpoint.dir given"};
  const double buffers = 1.0 + static_cast<double>(optimizer_kind(config.train.optimizer).state_names.size());
  const double need = 4.0 * buffers * static_cast<double>(parameter_count(transformer_spec(config.model)));
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string probe = (fs::path(dir) / (".doctor-" + std::to_string(getpid()))).string();
  if (FILE* f = std::fopen(probe.c_str(), "wb")) {
    const bool wrote = std::fwrite("trident", 1, 7, f) == 7 && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
    std::fclose(f);
    std::remove(probe.c_str());
    if (!wrote) return {c.name, Verdict::fail, dir + ": write failed: " + std::strerror(errno)};
  } else {
    return {c.name, Verdict::fail, dir + ": not writable: " + std::strerror(errno)};
  }
  struct statvfs s{};
  if (statvfs(dir.c_str(), &s) != 0) return {c.name, Verdict::fail, dir + ": statvfs: " + std::strerror(errno)};
  const double free = static_cast<double>(s.f_bavail) * static_cast<double>(s.f_frsize);
  c.detail = dir + format(": writable, %.2f GiB free, a checkpoint of the model %.2f GiB", free / (1 << 30),
                          need / (1 << 30));
  if (free < need) c.verdict = Verdict::fail;
  return c;
}

// On each node's first rank (each node uploads its own file): credentials found, the
// bucket reachable, and a probe object written, read back whole, and deleted.
Check s3_check(const CheckpointConfig& cc) {
  Check c{"S3 " + hostname(), Verdict::ok, ""};
  if (cc.upload.empty()) return {c.name, Verdict::skip, "no --checkpoint.upload given"};
  try {
    RemoteCheckpoints remote(cc.upload, cc);
    S3Client& client = remote.client();
    client.check_bucket(remote.uri().key(""));
    const std::string key = remote.uri().key(".doctor-" + hostname() + "-" + std::to_string(getpid()));
    std::string probe(size_t{1} << 20, '\0');
    for (size_t i = 0; i < probe.size(); i++) probe[i] = static_cast<char>(i * 2654435761u >> 24);
    const Timer t;
    client.put_object(key, probe);
    const double put_s = t.seconds();
    const std::optional<std::string> back = client.get_object(key);
    client.delete_object(key);
    if (!back || *back != probe)
      return {c.name, Verdict::fail, remote.describe() + ": the probe object read back differs from what was written"};
    const bool gone = !client.object_size(key).has_value();
    c.detail = remote.describe() + format(": a 1 MiB probe written (%.1f MB/s), read back equal, deleted",
                                          1.048576 / std::max(put_s, 1e-9)) +
               (gone ? "" : " (but still listed)");
    if (!gone) c.verdict = Verdict::fail;
  } catch (const std::exception& e) {
    return {c.name, Verdict::fail, e.what()};
  }
  return c;
}

// The nodes that failed a check of their own, for the batch script to drain (health/),
// written under checkpoint.dir when there is one and it takes files.
void write_preflight_verdict(const std::vector<Check>& checks, const std::vector<std::string>& rank_hosts,
                             const std::string& checkpoint_dir) {
  // A check every node fails is the job's (its credentials, a shared folder, a bar set too
  // high), not a node's: with more than one node, only a minority is named. S3 access
  // depends on the job's credentials and bucket: never a node's.
  std::map<std::string, int> failing;  // check (its name without the node) -> nodes failing it
  const auto kind = [](const Check& c) { return c.name.substr(0, c.name.size() - c.host.size()); };
  for (const Check& c : checks)
    if (c.verdict == Verdict::fail && !c.host.empty()) failing[kind(c)]++;
  const int nodes = static_cast<int>(std::set<std::string>(rank_hosts.begin(), rank_hosts.end()).size());
  health::Verdict v;
  std::vector<std::string> bad;
  for (const Check& c : checks) {
    if (c.verdict != Verdict::fail || c.host.empty() || c.name.rfind("S3 ", 0) == 0) continue;
    if (nodes > 1 && 2 * failing[kind(c)] > nodes) continue;
    if (std::find(bad.begin(), bad.end(), c.host) == bad.end()) bad.push_back(c.host);
    v.reason += (v.reason.empty() ? "preflight failed: " : ", ") + c.name;
    v.evidence += (v.evidence.empty() ? "" : "; ") + c.name + ": " + c.detail;
  }
  if (bad.empty() || checkpoint_dir.empty()) return;
  for (const std::string& h : bad) v.host += (v.host.empty() ? "" : ",") + h;
  for (int r = 0; r < static_cast<int>(rank_hosts.size()); r++)
    if (std::find(bad.begin(), bad.end(), rank_hosts[r]) != bad.end()) v.ranks.push_back(r);
  try {
    health::set_checkpoint_dir(checkpoint_dir);
    health::write(v);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "trident: warning: no health verdict written: %s\n", e.what());
  }
}

const char* verdict_name(Verdict v) { return v == Verdict::ok ? "ok" : v == Verdict::fail ? "FAIL" : "skip"; }

}  // namespace

int run_doctor_command(const std::vector<std::string>& args, const MpiWorld& mpi) {
  double expect_busbw = 0;
  bool help = false;
  po::options_description own("Options of 'trident doctor'");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")(
      "expect_busbw", po::value(&expect_busbw)->default_value(0.0, "0"),
      "all-reduce bus bandwidth (GB/s) below which a group fails (0: 0.3 on CPUs, half the slowest figure "
      "measured on 2-8 ranks of a 2-core machine; 10 on GPUs, above what NCCL reaches over TCP sockets)");
  const std::vector<std::string> rest = take_command_options(args, own, kUsage);
  if (help) {
    if (mpi.is_root()) {
      std::ostringstream text;
      text << kUsage << "\n" << own;
      std::printf("%s", text.str().c_str());
    }
    return 0;
  }
  CommandLine cl = parse_command_line("doctor", rest);
  Config config = cl.config;
  resolve_for_world(config, mpi.size());
  const bool cuda = config.train.device == Device::cuda;
  if (expect_busbw <= 0) expect_busbw = cuda ? 10.0 : 0.3;
  ParallelState parallel(config.dims(), config.parallel.ranks_per_node, config.parallel.timeout_s,
                         config.train.device);
  std::unique_ptr<kernels::Kernels> k = kernels::make_kernels(config.train.device, kernels::Precision::fp32);
  Communicator& world = parallel.world();
  const bool leader = parallel.node().rank() == 0;

  std::vector<Check> checks;  // rank 0's list; node leaders' checks are gathered into it
  const std::vector<std::string> hosts = world.gather_strings(hostname());
  if (mpi.is_root()) {
    checks.push_back(ranks_check(world, hosts));
    checks.push_back({"MPI", Verdict::ok, mpi.library_version()});
  }
  // Each node's own: its GPUs, its libraries and fabric, its checkpoint folder, its way to S3.
  std::string node_lines;
  if (leader) {
    std::vector<Check> mine = {gpus_check(parallel.node().size(), cuda)};
    for (Check& c : fabric_checks(cuda)) mine.push_back(std::move(c));
    mine.push_back(checkpoint_dir_check(config.checkpoint.dir, config));
    mine.push_back(s3_check(config.checkpoint));
    for (const Check& c : mine) node_lines += encode(on_this_node(c)) + "\n";
  }
  // Each node's ranks reduce among themselves (its memory and NVLink or shared memory),
  // all nodes at once: a slow node is named.
  if (world.all_reduce(static_cast<double>(parallel.node().size()), ReduceOp::max) > 1) {
    Check c = all_reduce_check(parallel.node(), parallel.node(), *k, /*device_memory=*/false, expect_busbw);
    if (parallel.node().size() < 2) c = {c.name, Verdict::skip, "one rank on this node: nothing to reduce"};
    if (leader) node_lines += encode(on_this_node(c)) + "\n";
  }
  for (const std::string& lines : world.gather_strings(node_lines)) {
    std::istringstream in(lines);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) checks.push_back(decode(l));
  }
  // The job's groups, each kind at once (collective: every rank runs them in one order).
  Communicator* groups[] = {&world, &parallel.dp(), &parallel.tp(), &parallel.pp()};
  for (Communicator* g : groups) {
    const double size = world.all_reduce(static_cast<double>(g->size()), ReduceOp::max);
    if (size < 2) continue;
    if (g == &world && parallel.nodes() == 1) continue;  // the node's group above
    Check c = all_reduce_check(*g, world, *k, g != &world, expect_busbw);
    if (mpi.is_root()) checks.push_back(c);
  }
  // The experts' token exchange, where a mixture of experts is split over ep ranks.
  if (Communicator* ep = parallel.expert_parallel(); ep != nullptr && transformer_spec(config.model).n_experts > 0) {
    Check c = all_to_all_check(*ep, world, *k, config, expect_busbw);
    if (mpi.is_root()) checks.push_back(c);
  }
  // The data, from rank 0 (it is the job's, as train's rank 0 lists it).
  if (mpi.is_root()) checks.push_back(data_check(config));
  std::string failed;
  if (mpi.is_root()) {
    std::printf("trident doctor: %d ranks, device %s\n\n| check | result | detail |\n| --- | --- | --- |\n",
                mpi.size(), k->name().c_str());
    int skipped = 0;
    for (const Check& c : checks) {
      std::printf("| %s | %s | %s |\n", c.name.c_str(), verdict_name(c.verdict), c.detail.c_str());
      if (c.verdict == Verdict::fail) failed += (failed.empty() ? "" : ", ") + c.name;
      if (c.verdict == Verdict::skip) skipped++;
    }
    if (failed.empty()) std::printf("\ndoctor: all checks passed (%d skipped: not on this machine)\n", skipped);
    else std::printf("\ndoctor: FAILED: %s\n", failed.c_str());
    std::fflush(stdout);
    write_preflight_verdict(checks, hosts, config.checkpoint.dir);
  }
  // Every rank exits with the verdict.
  return world.all_reduce(failed.empty() ? 0.0 : 1.0, ReduceOp::max) > 0 ? 1 : 0;
}

}  // namespace trident
