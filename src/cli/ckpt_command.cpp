#include "cli/ckpt_command.h"

#include <sys/stat.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_lease.h"
#include "ckpt/hf_checkpoint.h"
#include "ckpt/remote_checkpoints.h"
#include "kernels/base/error.h"
#include "runtime/byte_size.h"
#include "runtime/timer.h"
#include "storage/s3_uri.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr const char* kCkptUsage =
    "usage: trident ckpt ls      --checkpoint.dir=DIR\n"
    "  (DIR may be s3://bucket/prefix, what checkpoint.upload names; then --checkpoint.s3_endpoint and\n"
    "   --checkpoint.s3_region as in training, credentials as AWS's tools find them)\n"
    "       trident ckpt inspect --checkpoint.dir=DIR [--step=N]\n"
    "       trident ckpt export  --checkpoint.dir=DIR [--step=N] --out=FILE.h5\n"
    "       trident ckpt export  --checkpoint.dir=DIR [--step=N] --format=hf --out=DIR [--dtype=fp32|bf16]\n"
    "                            [--max_shard_gb=5]   (Hugging Face: config.json + safetensors)\n"
    "  (default step: the newest complete checkpoint)\n";

// The checkpoint of `step`, or the newest complete one.
Manifest choose(const std::string& dir, int step) {
  if (step >= 0) {
    const std::string path = (fs::path(dir) / step_name(step)).string();
    if (!fs::exists(path)) {  // a step never saved: say which were (an existing folder's faults read_manifest names)
      std::string saved;
      for (const std::string& c : complete_checkpoints(dir))
        saved += (saved.empty() ? "" : ", ") + std::to_string(step_of_name(fs::path(c).filename().string()));
      throw UsageError("no checkpoint of step " + std::to_string(step) + " in '" + dir + "': " +
                       (saved.empty() ? "it holds no complete checkpoint" : "its complete checkpoints are of steps " + saved));
    }
    return read_manifest(path);
  }
  const std::optional<Manifest> latest = find_latest_checkpoint(dir);
  require(latest.has_value(), "no complete checkpoint in '" + dir + "'");
  return *latest;
}

double mib(double bytes) { return bytes / (1 << 20); }

// Who holds the folder (ckpt/checkpoint_lease.h): a run that holds it renews it at step
// ends; one not renewed within its lease_s is stale (its run gone), and the next run takes it.
void print_lease(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "LEASE");
  if (!in) {
    std::printf("lease: none (no run holds this folder)\n");
    return;
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    const LeaseHolder h = parse_lease(text.str());
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    // Judged as a run starting here would (the file's time too; 600 s for a lease naming none).
    struct stat st {};
    const double mtime = stat((fs::path(dir) / "LEASE").c_str(), &st) == 0
                             ? static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9 : 0.0;
    const LeaseHolder me = this_process(0);
    const LeaseVerdict v = judge_lease(h, me, now, mtime, 600, holder_process_gone(h, me));
    std::printf("lease: %s (%s%s)\n", h.describe(now).c_str(), v.may_take() ? "free to take: " : "", v.why.c_str());
  } catch (const UsageError& e) {
    std::printf("lease: unreadable (%s)\n", e.what());
  }
}

// `ckpt ls` of the checkpoints in S3.
void list_remote(RemoteCheckpoints& remote) {
  const std::string latest = remote.latest().value_or("");
  std::printf("%-16s %-10s %8s %6s %10s  %s\n", "checkpoint", "state", "step", "files", "MiB", "layout (dp tp pp, zero)");
  for (const RemoteCheckpoints::Step& s : remote.steps()) {
    if (!s.complete) {
      std::printf("%-16s %-10s  (no manifest.json: an upload that did not finish)\n", s.name.c_str(), "incomplete");
      continue;
    }
    const Manifest m = remote.manifest(s.name, s.name);
    std::printf("%-16s %-10s %8d %6zu %10.1f  %d %d %d, %d%s\n", s.name.c_str(), "complete", m.step, m.files.size(),
                mib(static_cast<double>(s.bytes)), m.dims.size(Axis::dp), m.dims.size(Axis::tp), m.dims.size(Axis::pp), m.zero,
                s.name == latest ? "   <- latest" : "");
  }
}

// A checkpoint in S3 (`step`, else the latest) downloaded whole into `folder`, its files
// checked against the manifest's CRCs, for inspect and export to read as from disk.
Manifest download_remote(RemoteCheckpoints& remote, int step, const std::string& folder) {
  std::string name;
  if (step >= 0) {
    name = step_name(step);
  } else {
    const std::vector<std::string> candidates = remote.resume_candidates();
    require(!candidates.empty(), "no complete checkpoint in " + remote.uri().str());
    name = candidates.front();
  }
  const std::string dir = (fs::path(folder) / name).string();
  fs::create_directories(dir);
  Manifest m = remote.manifest(name, dir);
  double bytes = 0;
  Timer timer;
  for (const ManifestFile& f : m.files) bytes += static_cast<double>(remote.download(name, f, (fs::path(dir) / f.name).string()).bytes);
  std::printf("downloaded %s/%s: %zu node file(s), %.1f MiB in %.2f s, CRCs checked\n", remote.uri().str().c_str(),
              name.c_str(), m.files.size(), mib(bytes), timer.seconds());
  return m;
}

}  // namespace

int run_ckpt_command(const std::vector<std::string>& args) {
  const std::string action = args.empty() ? "" : args[0];
  std::string dir, out, format = "h5";
  int step = -1;
  CheckpointConfig s3;
  HfExportOptions hf;
  po::options_description options("Options of 'trident ckpt'");
  options.add_options()("help,h", "show this help")("checkpoint.dir", po::value(&dir), "checkpoint directory")(
      "step", po::value(&step), "step to inspect or export (default: newest complete)")(
      "out", po::value(&out), "export: the HDF5 file (h5) or the folder (hf) to write")(
      "format", po::value(&format)->default_value(format), "export: h5 (trident's) or hf (Hugging Face)")(
      "dtype", po::value(&hf.dtype)->default_value(hf.dtype), "export --format=hf: fp32 or bf16")(
      "max_shard_gb", po::value(&hf.max_shard_gb)->default_value(hf.max_shard_gb, "5"),
      "export --format=hf: largest safetensors file (GB, 1e9 bytes)")(
      "checkpoint.s3_endpoint", po::value(&s3.s3_endpoint), "s3:// checkpoints: an S3-compatible store's URL")(
      "checkpoint.s3_region", po::value(&s3.s3_region), "s3:// checkpoints: the bucket's region");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(std::vector<std::string>(args.begin() + (args.empty() ? 0 : 1), args.end()))
                  .options(options)
                  .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + "\n" + kCkptUsage);
  }
  if (vm.count("help") || action == "--help" || action == "-h") {
    std::printf("%s\n", kCkptUsage);
    return 0;
  }
  require(action == "ls" || action == "inspect" || action == "export",
          "ckpt needs ls, inspect or export, got '" + action + "'\n" + kCkptUsage);
  require(!dir.empty(), "ckpt " + action + " needs --checkpoint.dir");
  // From S3: ls reads the listing and the manifests; inspect and export read a copy.
  std::unique_ptr<RemoteCheckpoints> remote;
  std::string downloaded;  // the temporary folder of that copy
  struct Cleanup {
    std::string& folder;
    ~Cleanup() {
      std::error_code ignored;
      if (!folder.empty()) fs::remove_all(folder, ignored);
    }
  } cleanup{downloaded};
  if (is_s3_uri(dir)) {
    remote = std::make_unique<RemoteCheckpoints>(dir, s3);
    if (action == "ls") {
      list_remote(*remote);
      return 0;
    }
    std::string folder = (fs::temp_directory_path() / "trident-ckpt-XXXXXX").string();
    const char* made = mkdtemp(folder.data());
    check(made != nullptr, "cannot make a temporary folder in " + fs::temp_directory_path().string());
    downloaded = made;
  } else {
    require(fs::is_directory(dir), "checkpoint directory '" + dir + "' does not exist");
  }

  if (action == "ls") {
    const std::string latest = latest_name(dir);
    std::printf("%-16s %-10s %8s %6s %10s  %s\n", "checkpoint", "state", "step", "files", "MiB", "layout (dp tp pp, zero)");
    std::vector<fs::path> steps;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().starts_with("step_")) steps.push_back(e.path());
    std::sort(steps.begin(), steps.end());
    for (const fs::path& p : steps) {
      const std::string name = p.filename().string();
      try {
        const Manifest m = read_manifest(p.string());
        double bytes = 0;
        for (const auto& f : m.files) bytes += f.bytes;
        std::printf("%-16s %-10s %8d %6zu %10.1f  %d %d %d, %d%s\n", name.c_str(), "complete", m.step, m.files.size(),
                    mib(bytes), m.dims.size(Axis::dp), m.dims.size(Axis::tp), m.dims.size(Axis::pp), m.zero, name == latest ? "   <- latest" : "");
      } catch (const UsageError& e) {
        std::printf("%-16s %-10s  (%s)\n", name.c_str(), "incomplete", e.what());
      }
    }
    print_lease(dir);
    return 0;
  }
  const Manifest m = remote ? download_remote(*remote, step, downloaded) : choose(dir, step);
  if (action == "inspect") {
    std::printf("checkpoint %s: step %d, %s, %s, saved by dp=%d tp=%d pp=%d zero=%d on %d node(s)\n", m.dir.c_str(),
                m.step, transformer_spec(m.model).describe().c_str(), m.optimizer.c_str(), m.dims.size(Axis::dp),
                m.dims.size(Axis::tp), m.dims.size(Axis::pp), m.zero, m.nodes);
    for (const auto& f : m.files) std::printf("  %s: %.1f MiB, crc32 %08x, verified\n", f.name.c_str(), mib(f.bytes), f.crc32);
    // Beside the parameters, the optimizer's last state buffer (AdamW's second moment).
    const std::string state = m.optimizer_state.back();
    const auto params = read_canonical(m, "params"), second = read_canonical(m, state);
    const ParameterLayout layout(m.model);
    int width = 6;  // the longest name sets the column (Llama's run past 40 characters)
    for (const auto& p : params) width = std::max(width, static_cast<int>(p.first.size()));
    std::printf("%-*s %-16s %14s %14s\n", width, "tensor", "shape", "params rms", (state + " rms").c_str());
    for (size_t i = 0; i < params.size(); i++) {
      const auto rms = [](const std::vector<float>& x) {
        double s = 0;
        for (float v : x) s += static_cast<double>(v) * v;
        return std::sqrt(s / std::max<size_t>(1, x.size()));
      };
      std::string shape;
      for (int64_t d : layout.tensor(params[i].first).shape) {
        if (!shape.empty()) shape += 'x';
        shape += std::to_string(d);
      }
      std::printf("%-*s %-16s %14.4e %14.4e\n", width, params[i].first.c_str(), shape.c_str(), rms(params[i].second),
                  rms(second[i].second));
    }
    return 0;
  }
  require(format == "h5" || format == "hf", "--format must be h5 or hf, got '" + format + "'");
  if (format == "hf") {
    require(!out.empty(), "ckpt export --format=hf needs --out=DIR");
    const HfTransfer t = export_hf(m, out, hf);
    for (const std::string& caveat : hf_export_caveats(m)) std::fprintf(stderr, "trident: warning: %s\n", caveat.c_str());
    std::printf("exported the parameters of %s (step %d) to %s: %d safetensors file(s), %s of %s written in "
                "%.2f s (%.2f GB/s; reading the checkpoint took %.2f s)\n",
                m.dir.c_str(), m.step, out.c_str(), t.files, byte_size(t.bytes).c_str(), hf.dtype.c_str(), t.seconds,
                t.bytes / 1e9 / std::max(t.seconds, 1e-9), t.source_seconds);
    return 0;
  }
  require(!out.empty(), "ckpt export needs --out=FILE.h5");
  export_checkpoint(m, out);
  std::printf("exported the parameters of %s (step %d) to %s\n", m.dir.c_str(), m.step, out.c_str());
  return 0;
}

}  // namespace trident
