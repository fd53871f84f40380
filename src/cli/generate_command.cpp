#include "cli/generate_command.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/checkpoint_run.h"
#include "config/config.h"
#include "data/tokenizer.h"
#include "kernels/base/error.h"
#include "train/inference.h"

namespace po = boost::program_options;

namespace trident {

int run_generate_command(const std::vector<std::string>& args, const MpiWorld& world) {
  std::string prompt, dump_logits;
  SamplingSettings s;
  bool help = false;
  po::options_description own("Options of 'trident generate' (and every config key)");
  own.add_options()("help,h", po::bool_switch(&help), "show this help")("prompt", po::value(&prompt), "the text to continue")(
      "dump_logits", po::value(&dump_logits),
      "write the prompt's tokens and the logits after each of them (JSON) to this file, for comparisons")(
      "max_tokens", po::value(&s.max_tokens)->default_value(s.max_tokens), "tokens to generate")(
      "temperature", po::value(&s.temperature)->default_value(s.temperature), "0: greedy")(
      "top_k", po::value(&s.top_k)->default_value(s.top_k), "sample among the k most likely (0: all)")(
      "seed", po::value(&s.seed)->default_value(s.seed), "seed of the sampling");
  const std::vector<std::string> rest = take_command_options(args, own);
  if (help) {
    if (world.is_root()) {
      std::ostringstream text;
      text << "usage: trident generate --checkpoint.dir=DIR | --checkpoint.load=STEP_DIR --prompt TEXT [--max_tokens N]\n"
              "                        [--temperature T]\n\n"
           << own;
      std::printf("%s", text.str().c_str());
    }
    return 0;
  }
  require(s.max_tokens > 0 && s.temperature >= 0 && s.top_k >= 0,
          "--max_tokens must be positive, --temperature and --top_k >= 0");
  CheckpointRun run = open_checkpoint_run("generate", rest, world);
  load_checkpoint_run(run);
  std::vector<int32_t> ids = run.tokenizer->encode(prompt);
  const SpecialTokens special = run.tokenizer->special_tokens();
  if (ids.empty()) {
    require(special.bos >= 0 || special.eos >= 0, "--prompt is empty and the tokenizer has no start token");
    ids.push_back(special.bos >= 0 ? special.bos : special.eos);
  }
  if (!dump_logits.empty()) {
    require(static_cast<int>(ids.size()) <= run.config.model.seq_len,
            "--dump_logits: the prompt is longer than model.seq_len");
    // One forward pass per position over a seq_len window (causal: the zeros after p are unread).
    std::vector<int32_t> window(run.config.model.seq_len, 0);
    std::copy(ids.begin(), ids.end(), window.begin());
    nlohmann::json logits = nlohmann::json::array();
    for (int p = 0; p < static_cast<int>(ids.size()); p++) logits.push_back(run.setup->runner.next_token_logits(window.data(), p));
    if (run.parallel->is_root()) {
      std::ofstream out(dump_logits, std::ios::trunc);
      out << nlohmann::json{{"tokens", ids}, {"logits", logits}}.dump() << "\n";
      require(out.good(), "cannot write '" + dump_logits + "' (--dump_logits)");
    }
  }
  const std::vector<int32_t> out = generate_tokens(run.setup->runner, ids, run.config.model.seq_len, s, special.eos);
  if (run.parallel->is_root()) {
    // Decoded whole: a tokenizer may spell the boundary differently (SentencePiece's spaces).
    ids.insert(ids.end(), out.begin(), out.end());
    std::printf("%s\n", run.tokenizer->decode(ids).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace trident
