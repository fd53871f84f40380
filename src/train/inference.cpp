#include "train/inference.h"

#include <algorithm>
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "parallel/agreement.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "train/setup.h"

namespace po = boost::program_options;

namespace trident {

namespace {

int MpiRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 32) out += '?';
    else out += static_cast<char>(c);
  }
  return out;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingSettings& s, uint64_t draw) {
  const int V = static_cast<int>(logits.size());
  if (s.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const int k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  // The k most likely, ties to the lower id, so every rank orders them alike.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> p(k);
  const double top = logits[order[0]];
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[i] = std::exp((logits[order[i]] - top) / s.temperature);
  const double u = uniform_open(hash_key(s.seed, 0x73616d706c65ull, draw)) * sum;  // "sample"
  double cumulative = 0;
  for (int i = 0; i < k; i++)
    if (u < (cumulative += p[i])) return order[i];
  return order[k - 1];
}

std::vector<int32_t> generate_tokens(StepRunner& runner, const std::vector<int32_t>& prompt, int seq_len,
                                     const SamplingSettings& s, int32_t stop) {
  check(!prompt.empty(), "generate: an empty prompt");
  std::vector<int32_t> text = prompt, generated, window(seq_len);
  for (int i = 0; i < s.max_tokens; i++) {
    // The last seq_len tokens; causal attention leaves the padding after them unread.
    const size_t n = std::min<size_t>(text.size(), seq_len);
    std::fill(window.begin(), window.end(), 0);
    std::copy(text.end() - n, text.end(), window.begin());
    const int32_t next = sample_token(runner.next_token_logits(window.data(), static_cast<int>(n) - 1), s, i);
    generated.push_back(next);
    text.push_back(next);
    if (next == stop) break;
  }
  return generated;
}

EvalResult evaluate_split(StepRunner& runner, const Split& split, int seq_len, ParallelState& parallel,
                          uint64_t max_sequences) {
  // The windows: [begin + w T, begin + w T + T + 1) of each range, in order.
  struct Window {
    const TokenRange* range;
    uint64_t start;
  };
  std::vector<Window> windows;
  for (const TokenRange& r : split.ranges) {
    uint64_t count = r.size() > 0 ? (r.size() - 1) / seq_len : 0;
    if (max_sequences > 0) count = std::min(count, max_sequences);
    for (uint64_t w = 0; w < count; w++) windows.push_back({&r, r.begin + w * seq_len});
  }
  require(!windows.empty(), "the split holds no sequence of " + std::to_string(seq_len + 1) + " tokens");
  const int dp = parallel.size(Axis::dp), rank = parallel.coord(Axis::dp);
  std::vector<int32_t> buffer(seq_len + 1);
  double sum = 0;
  for (size_t first = 0; first < windows.size(); first += dp) {
    // Rank r takes window first + r; past the end it runs window 0 unweighted, so that
    // every rank of its tp and pp groups takes part in every forward.
    const size_t mine = first + rank;
    const Window& w = windows[mine < windows.size() ? mine : 0];
    w.range->dataset->read(w.start, seq_len + 1, buffer.data());
    const double loss = runner.forward_loss(buffer.data(), buffer.data() + 1, 1);
    if (mine < windows.size()) sum += loss * seq_len;
  }
  if (parallel.size(Axis::pp) > 1) sum = parallel.pp().all_reduce(sum);
  sum = parallel.dp().all_reduce(sum);
  EvalResult r;
  r.sequences = windows.size();
  r.tokens = windows.size() * static_cast<uint64_t>(seq_len);
  r.loss = sum / static_cast<double>(r.tokens);
  return r;
}

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

// A run on a checkpoint: its config, the grid, the model with the checkpoint loaded.
struct CheckpointRun {
  Config config;
  std::unique_ptr<ParallelState> parallel;
  std::unique_ptr<kernels::Kernels> k;
  std::unique_ptr<TrainingSetup> setup;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string checkpoint;
  int step = 0;
};

CheckpointRun open_checkpoint_run(const std::string& command, const std::vector<std::string>& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const CommandLine first = parse_command_line(command, args);
  const CheckpointConfig& cc = first.config.checkpoint;
  require(!cc.load.empty() || !cc.dir.empty(), command + " needs --checkpoint.dir=DIR (its newest complete step) or --checkpoint.load=STEP_DIR");
  CheckpointRun run;
  std::string ini;
  run_collectively([&] {
    if (MpiRank() != 0) return;
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
  const int dp = c.parallel.dp > 0 ? c.parallel.dp : world / std::max(1, c.parallel.tp * c.parallel.pp);
  c.train.global_batch = std::max(1, dp);
  c.train.micro_batch = 1;
  resolve_for_world(c, world);
  return run;
}

// After open_checkpoint_run, once communication may start: the grid and the model.
void load_checkpoint_run(CheckpointRun& run) {
  Config& c = run.config;
  run.parallel = std::make_unique<ParallelState>(c.dims(), c.parallel.ranks_per_node, c.parallel.timeout_s,
                                                 c.train.device);
  run.k = kernels::make_kernels(c.train.device, kernels::parse_precision(c.train.resolved_precision()));
  run.setup = std::make_unique<TrainingSetup>(c, *run.parallel, *run.k);
  Checkpointer checkpointer(c, *run.parallel, run.setup->model.store().parameters(), run.setup->optimizer,
                            run.setup->data_parallel);
  run_collectively([&] {
    run.step = checkpointer.load(read_manifest(run.checkpoint, /*verify_files=*/true));
    run.tokenizer = make_tokenizer(c.data.tokenizer, c.data.tokenizer_path);
  });
}

}  // namespace

int run_eval_command(const std::vector<std::string>& args) {
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
    if (MpiRank() == 0) {
      std::ostringstream text;
      text << "usage: trident eval --checkpoint.dir=DIR (its newest complete step) | --checkpoint.load=STEP_DIR\n"
              "                    [--data.path=...] [--split val|train]\n\n" << own;
      std::printf("%s", text.str().c_str());
    }
    return 0;
  }
  require(split_name == "val" || split_name == "train", "--split must be val or train, got '" + split_name + "'");
  CheckpointRun run = open_checkpoint_run("eval", rest);
  load_checkpoint_run(run);
  const Config& c = run.config;
  TrainingData data;
  run_collectively([&] {
    data = open_training_data(c.data.path, c.data.val_path, c.data.val_fraction, *run.tokenizer, c.data.json_key);
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

int run_generate_command(const std::vector<std::string>& args) {
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
    if (MpiRank() == 0) {
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
  CheckpointRun run = open_checkpoint_run("generate", rest);
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
