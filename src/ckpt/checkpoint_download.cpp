#include "ckpt/checkpoint_download.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_pieces.h"
#include "parallel/agreement.h"
#include "parallel/node_leaders.h"
#include "runtime/durable_file.h"
#include "kernels/base/error.h"
#include "runtime/timer.h"

namespace fs = std::filesystem;

namespace trident {

std::optional<StagedCheckpoint> stage_from_s3(const CheckpointConfig& config, ParallelState& parallel,
                                              RemoteCheckpoints* remote, const ParameterLayout& layout,
                                              int local_step) {
  Communicator& world = parallel.world();
  const std::string where = parse_s3_uri(config.upload).str();
  const bool leader = parallel.node().rank() == 0;
  std::vector<std::string> candidates;
  run_collectively([&] {
    if (!parallel.is_root()) return;
    for (const std::string& name : remote->resume_candidates())
      if (step_of_name(name) > local_step) candidates.push_back(name);
  });
  candidates = nlohmann::json::parse(broadcast_string(nlohmann::json(candidates).dump())).get<std::vector<std::string>>();
  if (candidates.empty()) return std::nullopt;
  const NodeLeaders leaders = node_leaders(parallel);
  const bool shared = shared_folder(parallel, config.dir);
  std::string problems;
  for (const std::string& name : candidates) {
    const std::string dir = (fs::path(config.dir) / name).string();
    std::string text;
    run_collectively([&] {
      if (parallel.is_root()) text = remote->manifest_text(name).value_or("");
    });
    text = broadcast_string(text);
    if (text.empty()) continue;  // pruned since it was listed
    Manifest m;
    run_collectively([&] { m = parse_manifest(text, dir, where + "/" + name + "/manifest.json"); });
    // The files this node's ranks read; on a shared file system, those of every node,
    // each fetched by one node leader.
    const std::vector<bool> mine = files_needed(m, layout);
    std::vector<double> needed(m.files.size());
    for (size_t i = 0; i < needed.size(); i++) needed[i] = mine[i] ? 1.0 : 0.0;
    (shared ? world : parallel.node()).all_reduce(std::span<double>(needed), ReduceOp::max);
    if (shared)
      for (size_t i = 0; i < needed.size(); i++)
        if (static_cast<int>(i) % leaders.count != leaders.index) needed[i] = 0;
    // The node leader fetches what its disk lacks (a file left by an earlier try, or
    // this node's own from before a crash, counts if it verifies).
    std::string error;
    double bytes = 0, files = 0;
    const Timer timer;
    if (leader) {
      try {
        fs::create_directories(dir);
        for (size_t i = 0; i < m.files.size(); i++) {
          if (needed[i] == 0) continue;
          const ManifestFile& f = m.files[i];
          const std::string path = (fs::path(dir) / f.name).string();
          bool have = false;
          if (fs::exists(path)) {
            try {
              verify_node_file(path, f);
              have = true;
            } catch (const UsageError&) {
            }
          }
          if (have) continue;
          const S3Transfer t = remote->download(name, f, path);
          bytes += static_cast<double>(t.bytes);
          files += 1;
        }
      } catch (const UsageError& e) {
        error = e.what();
      } catch (const fs::filesystem_error& e) {  // the local disk (full, read-only): said, not a crash
        error = e.what();
      }
    }
    const double seconds = timer.seconds();
    double totals[3] = {bytes, files, error.empty() ? 0.0 : 1.0};
    world.all_reduce(std::span<double>(totals, 3), ReduceOp::sum);
    const double slowest = world.all_reduce(seconds, ReduceOp::max);
    if (totals[2] > 0) {
      const std::vector<std::string> errors = world.gather_strings(error);
      if (parallel.is_root()) {
        std::string said;
        for (const std::string& e : errors)
          if (!e.empty()) said += e + "; ";
        std::fprintf(stderr, "trident: warning: the checkpoint %s in S3 cannot be loaded: %sfalling back to the "
                             "complete checkpoint before it\n",
                     (where + "/" + name).c_str(), said.c_str());
        problems += name + ": " + said;
      }
      continue;
    }
    // Where this node's disk now holds every file (one node, or a shared file system),
    // the checkpoint is complete on disk too: manifest and latest, as a save writes them.
    if (parallel.is_root()) {
      bool all = true;
      for (const ManifestFile& f : m.files) all = all && fs::exists(fs::path(dir) / f.name);
      if (all) {
        write_text_atomically((fs::path(dir) / "manifest.json").string(), text);
        write_text_atomically((fs::path(config.dir) / "latest").string(), name + "\n");
      }
    }
    return StagedCheckpoint{m, text, totals[0], slowest, static_cast<int>(totals[1])};
  }
  if (!candidates.empty())
    throw AgreedUsageError("no loadable checkpoint in " + where + ": " + broadcast_string(problems));
  return std::nullopt;
}

}  // namespace trident
