// `trident prepare`, `train` on what it writes, `eval` and `generate`, through the
// executable as a user runs them: the same dataset bytes for any rank count, text,
// JSONL and gzip input, what bad input does (one error naming the file and line,
// nothing left that looks complete), and eval/generate giving the same under every
// layout.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_helpers.h"
#include "data/indexed_dataset.h"

namespace fs = std::filesystem;

namespace trident {
namespace {


std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + "trident_prepare_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string bytes_of(const std::string& path) { return slurp(path); }

// A small corpus: text with '%' separators in two files, a JSONL file, a gzipped copy.
std::string make_inputs(const std::string& dir) {
  fs::create_directories(dir + "/in");
  std::ofstream(dir + "/in/a.txt") << "The quick brown fox.\n%\nJumps over\nthe lazy dog.\n%\n\n%\nA third one.\n";
  std::ofstream(dir + "/in/b.txt") << "A whole file is one document\nwhen it has no separator.\n";
  std::ofstream(dir + "/in/c.jsonl") << "{\"text\": \"json one\", \"id\": 1}\n{\"text\": \"json two\\nlines\"}\n\n";
  gzFile g = gzopen((dir + "/in/d.jsonl.gz").c_str(), "wb");
  const std::string gz = "{\"text\": \"from gzip\"}\n";
  gzwrite(g, gz.data(), static_cast<unsigned>(gz.size()));
  gzclose(g);
  return dir + "/in";
}

TEST(Prepare, SameBytesForAnyRankCountAndEveryInputForm) {
  const std::string dir = fresh_dir("ranks");
  const std::string in = make_inputs(dir);
  for (int ranks : {1, 2, 3}) {
    // One rank with no --data.tokenizer: byte, the default, and said so (the same bytes below).
    const bool named = ranks > 1;
    const CliRun r = run("prepare --input " + in + " --out " + dir + "/r" + std::to_string(ranks) +
                             (named ? " --data.tokenizer=byte" : ""), kMpirun + std::to_string(ranks), 60);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("prepared"), std::string::npos) << r.out;
    EXPECT_EQ(count(r.out, "prepare: no --data.tokenizer given: byte-level tokens"), named ? 0 : 1) << r.out;
  }
  for (const char* ext : {".bin", ".idx"}) {
    EXPECT_EQ(bytes_of(dir + "/r2" + ext), bytes_of(dir + "/r1" + ext)) << ext;
    EXPECT_EQ(bytes_of(dir + "/r3" + ext), bytes_of(dir + "/r1" + ext)) << ext;
  }
  // Every document once, in order, as the rules say (the blank line between two '%'
  // lines is a document of one newline; empty JSONL lines are none); byte tokens have
  // no end-of-document token.
  const IndexedDataset d(dir + "/r1");
  const std::vector<std::string> want = {"The quick brown fox.\n", "Jumps over\nthe lazy dog.\n", "\n", "A third one.\n",
                                         "A whole file is one document\nwhen it has no separator.\n", "json one",
                                         "json two\nlines", "from gzip"};
  ASSERT_EQ(d.documents(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    std::vector<int32_t> t(d.sequence_start(i + 1) - d.sequence_start(i));
    d.read(d.sequence_start(i), t.size(), t.data());
    EXPECT_EQ(std::string(t.begin(), t.end()), want[i]) << "document " << i;
  }
  EXPECT_NE(slurp(dir + "/r1.json").find("\"documents\": 8"), std::string::npos);
  // No part files left behind.
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".part"), std::string::npos) << e.path();
}

TEST(Prepare, BadInputIsOneErrorAndLeavesNothing) {
  const std::string dir = fresh_dir("bad");
  fs::create_directories(dir + "/in");
  std::ofstream(dir + "/in/good.jsonl") << "{\"text\": \"fine\"}\n";
  std::ofstream(dir + "/in/z.jsonl") << "{\"text\": \"fine\"}\n{\"body\": \"no text key\"}\n";
  std::ofstream(dir + "/notjson.jsonl") << "{\"text\": \"fine\"}\nnot json at all\n";
  const struct {
    std::string args, expected;
  } cases[] = {
      {"--input " + dir + "/in --out " + dir + "/o --data.tokenizer=byte", "z.jsonl: line 2 has no string \"text\""},
      {"--input " + dir + "/notjson.jsonl --out " + dir + "/o --data.tokenizer=byte", "notjson.jsonl: line 2 is not JSON"},
      {"--input " + dir + "/missing --out " + dir + "/o --data.tokenizer=byte", "does not exist"},
      {"--input " + dir + "/in --out " + dir + "/o --data.tokenizer=gpt2 --data.tokenizer_path=" + dir + "/nothing",
       dir + "/nothing"},
  };
  for (const auto& c : cases) {
    const CliRun r = run("prepare " + c.args, kMpirun + "2", 60);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(count(r.err, "trident: error:"), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << "\n" << r.err;
    for (const char* ext : {".bin", ".idx", ".json", ".bin.tmp", ".part0of2.bin", ".part1of2.bin"})
      EXPECT_FALSE(fs::exists(dir + "/o" + ext)) << c.args << ": " << ext << " left behind";
  }
}

// A tokenizer trained on the corpus, a dataset prepared with it, 30 steps on it with a
// checkpoint; then eval and greedy generate under three layouts.
TEST(Prepare, TrainEvalAndGenerateOnAPreparedDataset) {
  const std::string dir = fresh_dir("train");
  const CliRun p = run("prepare --input /usr/share/games/fortunes/computers --input /usr/share/games/fortunes/science "
                       "--out " + dir + "/fortunes --data.tokenizer=sentencepiece --train_tokenizer=512",
                       kMpirun + "2", 120);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::string data = "--data.path=" + dir + "/fortunes --data.tokenizer=sentencepiece --data.tokenizer_path=" +
                           dir + "/fortunes.model ";
  const std::string ckpt = dir + "/ckpt";
  const CliRun t = run("train --config configs/tiny.ini --model.n_layer=2 --model.vocab_size=512 --train.steps=30 "
                       "--train.global_batch=8 --log.every_steps=10 --log.val_batches=2 --log.peak_gflops=100 "
                       "--log.sample_every_steps=30 --checkpoint.dir=" + ckpt + " --checkpoint.every_steps=30 "
                       "--log.run_dir=" + dir + "/run " + data);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("Megatron indexed dataset"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("step 30 | sample: "), std::string::npos) << t.out;
  // The vocabulary must hold the data's ids: bad input before training starts.
  const CliRun small = run("train --config configs/tiny.ini --model.vocab_size=256 --train.steps=1 " + data);
  EXPECT_EQ(small.exit_code, 2) << small.err;
  EXPECT_NE(small.err.find("model.vocab_size (256)"), std::string::npos) << small.err;
  // Another dataset under the checkpoint: said clearly.
  const CliRun other = run("train --config configs/tiny.ini --model.n_layer=2 --model.vocab_size=512 --train.steps=40 "
                           "--train.global_batch=8 --checkpoint.dir=" + ckpt + " --log.run_dir=" + dir + "/run2");
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_NE(other.err.find("was trained on other data"), std::string::npos) << other.err;

  std::string eval_ref, text_ref;
  for (const std::string& layout : {std::string("1"), std::string("2 --parallel.tp=2"), std::string("4 --parallel.dp=2 --parallel.pp=2")}) {
    const std::string launcher = kMpirun + layout.substr(0, 1), flags = layout.size() > 1 ? layout.substr(2) : "";
    const CliRun e = run("eval --checkpoint.dir=" + ckpt + " " + flags, launcher, 120);
    ASSERT_EQ(e.exit_code, 0) << layout << "\n" << e.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(e.out, m, std::regex("loss ([0-9.]+), perplexity ([0-9.]+)"))) << e.out;
    const std::string loss = m[1];
    EXPECT_GT(std::stod(loss), 0.0);
    EXPECT_LT(std::stod(loss), std::log(512.0));  // below chance after 30 steps
    const CliRun g = run("generate --checkpoint.dir=" + ckpt + " --prompt \"Computers are\" --max_tokens 20 " + flags,
                         launcher, 120);
    ASSERT_EQ(g.exit_code, 0) << layout << "\n" << g.err;
    EXPECT_EQ(g.out.rfind("Computers are", 0), 0u) << g.out;
    if (eval_ref.empty()) {
      eval_ref = loss;
      text_ref = g.out;
    }
    EXPECT_NEAR(std::stod(loss), std::stod(eval_ref), 1e-5) << layout;
    EXPECT_EQ(g.out, text_ref) << layout;  // greedy: the same text under every layout
  }
}

// Document masking on a real tokenizer's end-of-document token (SentencePiece's </s>): the
// same losses with the sequence split over two cp ranks; eval follows the checkpoint's
// setting (masked), and turning it off by flag changes the loss.
TEST(Prepare, DocumentMaskingTrainsAtAnyCpAndEvalFollowsTheCheckpoint) {
  const std::string dir = fresh_dir("masked");
  const CliRun p = run("prepare --input /usr/share/games/fortunes/computers --out " + dir +
                           "/fortunes --data.tokenizer=sentencepiece --train_tokenizer=512",
                       kMpirun + "2", 120);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const std::string train = "train --config configs/tiny.ini --model.n_layer=2 --model.vocab_size=512 --train.steps=6 "
                            "--train.global_batch=4 --log.every_steps=1 --log.val_batches=0 --log.peak_gflops=100 "
                            "--data.document_mask=true --data.path=" + dir + "/fortunes --data.tokenizer=sentencepiece "
                            "--data.tokenizer_path=" + dir + "/fortunes.model ";
  const std::string ckpt = dir + "/ckpt";
  const CliRun one = run(train + "--checkpoint.dir=" + ckpt + " --checkpoint.every_steps=6 --log.run_dir=" + dir + "/r1");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CliRun two = run(train + "--parallel.cp=2 --log.run_dir=" + dir + "/r2", kMpirun + "2", 120);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const std::map<int, double> a = step_losses(one.out), b = step_losses(two.out);
  ASSERT_EQ(a.size(), 6u) << one.out;
  ASSERT_EQ(b.size(), a.size()) << two.out;
  for (const auto& [step, loss] : a) {
    ASSERT_EQ(b.count(step), 1u) << "step " << step << "\n" << two.out;
    EXPECT_NEAR(loss, b.at(step), 2e-4) << "step " << step;
  }
  const auto eval_loss = [&](const std::string& flags) {
    const CliRun e = run("eval --checkpoint.dir=" + ckpt + " " + flags);
    EXPECT_EQ(e.exit_code, 0) << e.err;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(e.out, m, std::regex("loss ([0-9.]+), perplexity"))) << e.out;
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double masked = eval_loss(""), whole = eval_loss("--data.document_mask=false");
  EXPECT_GT(std::abs(masked - whole), 1e-4) << masked << " " << whole;
}

}  // namespace
}  // namespace trident
