// Config parsing and validation: INI files, flags that win, and one clear UsageError
// for every kind of bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "config/config.h"
#include "model/transformer_spec.h"
#include "train/setup.h"
#include "kernels/base/error.h"

namespace trident {
namespace {

std::string write_ini(const std::string& text) {
  const std::string path = testing::TempDir() + "trident_test_config.ini";
  std::ofstream(path) << text;
  return path;
}

// The UsageError message of parsing `args`, or "" if it parsed.
std::string error_of(const std::vector<std::string>& args, int world = 1) {
  try {
    CommandLine cl = parse_command_line("train", args);
    resolve_for_world(cl.config, world);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ReadsIniAndFlagsWin) {
  const std::string ini = write_ini("[model]\nn_layer = 6\nd_model = 96\nn_head = 6\n[train]\nlr = 0.01\nsteps = 7\n");
  const CommandLine cl = parse_command_line("train", {"--config", ini, "--train.lr=0.002", "--model.n_layer", "3"});
  EXPECT_EQ(cl.config.model.n_layer, 3);  // flag beats the file
  EXPECT_EQ(cl.config.model.d_model, 96);  // from the file
  EXPECT_EQ(cl.config.model.n_head, 6);
  EXPECT_DOUBLE_EQ(cl.config.train.lr, 0.002);
  EXPECT_EQ(cl.config.train.steps, 7);
  EXPECT_EQ(cl.config.train.global_batch, TrainConfig{}.global_batch);  // default kept
}

// The keys the user set, by the file or a flag, are known apart from defaults (trident plan
// keeps them); a stored config below them (a checkpoint's) sets none.
TEST(Config, KnowsTheKeysTheUserSet) {
  const std::string ini = write_ini("[model]\nn_layer = 6\nd_model = 96\nn_head = 6\n[parallel]\ntp = 2\n");
  const CommandLine cl = parse_command_line("train", {"--config", ini, "--parallel.zero=1"}, "[train]\nsteps = 9\n");
  EXPECT_EQ(cl.given, (std::set<std::string>{"model.n_layer", "model.d_model", "model.n_head", "parallel.tp",
                                             "parallel.zero"}));
  EXPECT_EQ(cl.config.train.steps, 9);
}

TEST(Config, ShippedConfigsParse) {
  for (const char* file : {"configs/tiny.ini", "configs/gpt2-124m.ini"}) {
    CommandLine cl = parse_command_line("train", {"--config", file});
    cl.config.resolve_layout(1);
    EXPECT_EQ(cl.config.parallel.dp, 1) << file;
  }
  const CommandLine gpt2 = parse_command_line("train", {"--config", "configs/gpt2-124m.ini"});
  EXPECT_EQ(gpt2.config.model.n_layer, 12);
  EXPECT_EQ(gpt2.config.model.n_head, 12);
  EXPECT_EQ(gpt2.config.model.d_model, 768);
  EXPECT_EQ(gpt2.config.model.seq_len, 1024);
  EXPECT_EQ(gpt2.config.model.vocab_size, 50257);
  const TransformerSpec spec = transformer_spec(gpt2.config.model);
  EXPECT_EQ(spec.padded_vocab(1), 50304);
  // 855 MFLOP per token, as shared/MACHINE.md counts GPT-2 124M.
  EXPECT_NEAR(flops_per_token(spec) / 1e6, 855.0, 1.0);
}

TEST(Config, ResolvedConfigRoundTrips) {
  CommandLine cl = parse_command_line("train", {"--config", "configs/tiny.ini", "--train.seed=99"});
  cl.config.resolve_layout(1);
  const std::string printed = cl.config.to_ini();
  EXPECT_NE(printed.find("[model]\nfamily = gpt2\nn_layer = 4\n"), std::string::npos) << printed;
  const CommandLine again = parse_command_line("train", {"--config", write_ini(printed)});
  EXPECT_EQ(again.config.to_ini(), printed);
  EXPECT_EQ(again.config.train.seed, 99u);
}

TEST(Config, BadInputIsOneClearError) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model.n_layers=3"}, "model.n_layers"},                      // unknown flag
      {{"--config", write_ini("[model]\ndepth = 3\n")}, "model.depth"},  // unknown INI key
      {{"--config", "/nonexistent/x.ini"}, "/nonexistent/x.ini"},      // missing file
      {{"--train.lr=-1"}, "train.lr"},                                 // negative learning rate
      {{"--model.d_model=100", "--model.n_head=3"}, "multiple of model.n_head"},
      {{"--model.n_layer=abc"}, "model.n_layer"},                      // not a number
      {{"--model.n_layer=0"}, "model.n_layer must be positive"},
      {{"--train.beta2=1.5"}, "train.beta2"},
      {{"--train.min_lr=1", "--train.lr=0.1"}, "train.min_lr"},
      {{"--train.device=tpu"}, "train.device must be cpu or cuda, got 'tpu'"},
      {{"--model.family=mamba"}, "model.family must be gpt2, llama, mistral, mixtral, olmo2, qwen2, qwen3 or qwen3_moe, got 'mamba'"},
      {{"--parallel.schedule=zigzag"}, "parallel.schedule must be 1f1b, gpipe, interleaved or zb1, got 'zigzag'"},
      {{"--parallel.vpp=0"}, "parallel.vpp must be positive"},
      {{"--train.precision=fp16"}, "train.precision must be fp32, bf16 or auto, got 'fp16'"},
      {{"--train.recompute=some"}, "train.recompute must be none, selective or full, got 'some'"},
      {{"--train.recompute=full", "--train.recompute_layers=-1"}, "train.recompute_layers must be >= 0"},
      {{"--train.recompute_layers=2"}, "train.recompute_layers=2 needs train.recompute=full (it is none)"},
      {{"--train.recompute_method=even"}, "train.recompute_method must be uniform or block, got 'even'"},
      {{"--data.tokenizer=wordpiece"}, "data.tokenizer must be byte, gpt2, llama3 or sentencepiece, got 'wordpiece'"},
      {{"--device=tpu"}, "train.device must be cpu or cuda"},
      {{"--train.global_batch=6", "--train.micro_batch=4"}, "train.micro_batch (4) must divide"},
      {{"--parallel.tp=2"}, "tp*cp*pp"},                                  // 1 rank, tp 2
      {{"--data.val_fraction=1"}, "data.val_fraction"},
  };
  for (const auto& [args, expected] : cases) {
    const std::string message = error_of(args);
    EXPECT_NE(message.find(expected), std::string::npos)
        << "args " << args[0] << ": message '" << message << "' should mention '" << expected << "'";
  }
  EXPECT_EQ(error_of({"--train.lr=0.01"}), "");
}

// Keys are exact in flags as in files (Boost's unique-prefix guessing off: --train.warmup
// once set warmup_steps), an unknown one names the closest keys, an INI error its file
// and line, and an empty flag clears what the file set.
TEST(Config, ExactKeysSuggestionsFileLinesAndEmptyValues) {
  EXPECT_NE(error_of({"--train.warmup=10"}).find("did you mean --train.warmup_steps?"), std::string::npos)
      << error_of({"--train.warmup=10"});
  EXPECT_NE(error_of({"--train.step=3"}).find("did you mean --train.steps?"), std::string::npos);
  EXPECT_EQ(error_of({"--zzz.qqq=1"}).find("did you mean"), std::string::npos) << "nothing close: no guess";
  const std::string ini = write_ini("# a comment\n[train]\nlr = 0.01\nwarmup = 3\n");
  const std::string unknown = error_of({"--config", ini});
  EXPECT_NE(unknown.find(ini + ":4:"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("did you mean train.warmup_steps?"), std::string::npos) << unknown;
  const std::string broken = write_ini("[model]\nn_layer = 2\n[train\nsteps = 3\n");
  const std::string syntax = error_of({"--config", broken});
  EXPECT_NE(syntax.find(broken + ":3:"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("[train"), std::string::npos) << syntax;
  const std::string with_dir = write_ini("[checkpoint]\ndir = somewhere\n");
  EXPECT_EQ(parse_command_line("train", {"--config", with_dir}).config.checkpoint.dir, "somewhere");
  EXPECT_EQ(parse_command_line("train", {"--config", with_dir, "--checkpoint.dir="}).config.checkpoint.dir, "");
}

// A value close to a choice names it (its case, '-' for '_', a letter off), and a key
// that other trainers or Hugging Face spell out names ours.
TEST(Config, ValuesAndLongKeyNamesSuggestWhatWasMeant) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model.family=qwen3-moe"}, "got 'qwen3-moe' (did you mean qwen3_moe?)"},
      {{"--model.family=Mixtral"}, "got 'Mixtral' (did you mean mixtral?)"},
      {{"--model.family=lama"}, "got 'lama' (did you mean llama?)"},
      {{"--train.optimizer=Lion"}, "got 'Lion' (did you mean lion?)"},
      {{"--train.precision=BF16"}, "got 'BF16' (did you mean bf16?)"},
      {{"--parallel.expert_parallel=2"}, "(did you mean --parallel.ep?)"},
      {{"--parallel.tensor_parallel=2"}, "(did you mean --parallel.tp?)"},
      {{"--pipeline_parallel=2"}, "(did you mean --parallel.pp?)"},
      {{"--parallel.context-parallel=2"}, "(did you mean --parallel.cp?)"},
      {{"--parallel.data_parallel=2"}, "(did you mean --parallel.dp?)"},
      {{"--model.num_hidden_layers=2"}, "(did you mean --model.n_layer?)"},
  };
  for (const auto& [args, expected] : cases)
    EXPECT_NE(error_of(args).find(expected), std::string::npos) << args[0] << ": " << error_of(args);
  EXPECT_EQ(error_of({"--model.family=mamba"}).find("did you mean"), std::string::npos) << "nothing close: no guess";
  const std::string ini = write_ini("[parallel]\nexpert_parallel = 2\n");
  const std::string in_file = error_of({"--config", ini});
  EXPECT_NE(in_file.find(ini + ":2:"), std::string::npos) << in_file;
  EXPECT_NE(in_file.find("(did you mean parallel.ep?)"), std::string::npos) << in_file;
}

TEST(Config, LayoutArithmetic) {
  CommandLine cl = parse_command_line("train", {"--train.global_batch=12"});
  Config c = cl.config;
  c.resolve_layout(3);  // dp = 3 ranks, 4 sequences each
  EXPECT_EQ(c.parallel.dp, 3);
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.accumulation_steps(3), 1);
  EXPECT_NE(error_of({"--train.global_batch=12"}, 5).find("multiple of dp"), std::string::npos);
  EXPECT_NE(error_of({"--parallel.dp=2"}, 3).find("3 ranks"), std::string::npos);
}

}  // namespace
}  // namespace trident
