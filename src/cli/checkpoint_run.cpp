#include "cli/checkpoint_run.h"

#include <algorithm>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "parallel/agreement.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

// The [model] and [data] sections of a checkpoint's stored config: what the model was
// and what it read; the layout, training and logging are this run's own.
std::string model_and_data_sections(const std::string& ini) {
  std::istringstream in(ini);
  std::string line, out, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') section = line;
    if (section == "[model]" || section == "[data]") out += line + "\n";
  }
  return out;
}

}  // namespace

CheckpointRun open_checkpoint_run(const std::string& command, const std::vector<std::string>& args,
                                  const MpiWorld& world) {
  const CommandLine first = parse_command_line(command, args);
  const CheckpointConfig& cc = first.config.checkpoint;
  require(!cc.load.empty() || !cc.dir.empty(), command + " needs --checkpoint.dir=DIR (its newest complete step) or --checkpoint.load=STEP_DIR");
  CheckpointRun run;
  std::string ini;
  run_collectively([&] {
    if (!world.is_root()) return;
    const Manifest m = cc.load.empty() ? find_latest_checkpoint(cc.dir).value_or(Manifest{}) : read_manifest(cc.load);
    require(!m.dir.empty(), "no checkpoint in '" + cc.dir + "'");
    run.checkpoint = m.dir;
    ini = m.config_ini;
  });
  run.checkpoint = broadcast_string(run.checkpoint);
  run.config = parse_command_line(command, args, model_and_data_sections(broadcast_string(ini))).config;
  Config& c = run.config;
  c.checkpoint.load = run.checkpoint;
  // One sequence per forward on each dp rank.
  const int dp = c.parallel.dp > 0 ? c.parallel.dp : world.size() / std::max(1, c.parallel.tp * c.parallel.pp);
  c.train.global_batch = std::max(1, dp);
  c.train.micro_batch = 1;
  resolve_for_world(c, world.size());
  require(c.parallel.cp == 1, command + " runs each sequence on one rank: parallel.cp must be 1 (the checkpoint "
                                        "loads at any cp)");
  return run;
}

void load_checkpoint_run(CheckpointRun& run) {
  Config& c = run.config;
  run.parallel = std::make_unique<ParallelState>(c.dims(), c.parallel.ranks_per_node, c.parallel.timeout_s,
                                                 c.train.device);
  run.k = kernels::make_kernels(c.train.device, c.train.resolved_precision());
  run_collectively([&] {
    run.tokenizer = make_tokenizer(c.data.tokenizer, c.data.tokenizer_path);
    resolve_eod_token(c.data, *run.tokenizer);  // the training's document masking, if it had one
  });
  run.setup = std::make_unique<TrainingSetup>(c, *run.parallel, *run.k);
  Checkpointer checkpointer(c, *run.parallel, run.setup->sharded_state());
  run_collectively([&] { run.step = checkpointer.load(read_manifest(run.checkpoint, /*verify_files=*/true)); });
}

}  // namespace trident
