#include "cli/eval_command.h"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "data/s3_data.h"
#include "cli/checkpoint_run.h"
#include "config/config.h"
#include "data/token_dataset.h"
#include "parallel/agreement.h"
#include "kernels/base/error.h"
#include "train/inference.h"

namespace po = boost::program_options;

namespace trident {

int run_eval_command(const std::vector<std::string>& args, const MpiWorld& world) {
  std::string split_name = "val";
  bool help = false;
  uint64_t max_sequences = 0;
  po::options_description own("Options of 'trident eval' (and every config key)");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")("split", po::value(&split_name)->default_value(split_name),
                                                 "val (the held-out documents) or train")(
      "max_sequences", po::value(&max_sequences)->default_value(0),
      "at most this many windows of each dataset (0: all)");
  const std::vector<std::string> rest = take_command_options(args, own);
  if (help) {
    if (world.is_root()) {
      std::ostringstream text;
      text << "usage: trident eval --checkpoint.dir=DIR (its newest complete step) | --checkpoint.load=STEP_DIR\n"
              "                    [--data.path=...] [--split val|train]\n\n" << own;
      std::printf("%s", text.str().c_str());
    }
    return 0;
  }
  require(split_name == "val" || split_name == "train", "--split must be val or train, got '" + split_name + "'");
  CheckpointRun run = open_checkpoint_run("eval", rest, world);
  load_checkpoint_run(run);
  const Config& c = run.config;
  TrainingData data;
  const StagedData staged = stage_s3_data(c, *run.parallel, /*copy_while_reading=*/false);  // s3:// entries: their local copies, or streamed
  const DataConfig& d = staged.data;
  run_collectively([&] {
    data = open_training_data(d.path, d.val_path, d.val_fraction, *run.tokenizer, d.json_key, staged.open_remote);
    data.background = staged.background;
    require(data.max_token < c.model.vocab_size, "the data holds token id " + std::to_string(data.max_token) +
                                                     ", beyond model.vocab_size (" + std::to_string(c.model.vocab_size) +
                                                     ")");
  });
  const Split& split = split_name == "val" ? data.val : data.train;
  require(!split.ranges.empty(), "the data has no " + split_name + " split (data.val_fraction or data.val_path)");
  const EvalResult r = evaluate_split(run.setup->runner, split, c.model.seq_len, *run.parallel, max_sequences);
  if (run.parallel->is_root())
    std::printf("eval %s (step %d) on %s split of %s: %llu sequences of %d tokens, loss %.6f, perplexity %.4f\n",
                run.checkpoint.c_str(), run.step, split_name.c_str(), data.description.c_str(),
                static_cast<unsigned long long>(r.sequences), c.model.seq_len, r.loss, std::exp(r.loss));
  return 0;
}

}  // namespace trident
