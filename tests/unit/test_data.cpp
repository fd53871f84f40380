// Training data: text split into documents, Megatron datasets and llm.c shards read as
// their tools write them, the held-out split, blends, and batches that depend only on
// (seed, step, index).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

std::string make_corpus_dir() {
  const std::string dir = testing::TempDir() + "trident_corpus";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/a") << "one\n%\ntwo two\n%\nthree\n";
  std::ofstream(dir + "/b") << "four\n%\nfive\n";
  std::ofstream(dir + "/a.dat") << "binary index, skipped";
  std::ofstream(dir + "/a.u8") << "utf-8 copy, skipped";
  return dir;
}

std::string text_of(const TokenRange& r) {
  std::vector<int32_t> t(r.size());
  r.dataset->read(r.begin, t.size(), t.data());
  return std::string(t.begin(), t.end());
}

const std::unique_ptr<Tokenizer> kBytes = make_tokenizer(TokenizerKind::byte, "");

TEST(TrainingData, TextSplitsDocumentsAndHoldsOutTheLast) {
  const TrainingData d = open_training_data(make_corpus_dir(), "", 0.2, *kBytes);
  EXPECT_EQ(d.files, 2u);
  EXPECT_EQ(d.documents, 5u);
  ASSERT_EQ(d.train.ranges.size(), 1u);
  EXPECT_EQ(text_of(d.train.ranges[0]), "one\n%\ntwo two\n%\nthree\n%\nfour\n%\n");
  EXPECT_EQ(text_of(d.val.ranges[0]), "five\n%\n");
}

TEST(TrainingData, UnigramEntropyOfTheTrainingSplit) {
  const std::string dir = testing::TempDir() + "trident_entropy";
  fs::create_directories(dir);
  std::ofstream(dir + "/t") << "ab\n";  // "ab\n%\n": a, b, % once each, newline twice
  const TrainingData d = open_training_data(dir + "/t", "", 0.0, *kBytes);
  EXPECT_NEAR(d.unigram_entropy, -(3 * 0.2 * std::log(0.2) + 0.4 * std::log(0.4)), 1e-12);
}

TEST(TrainingData, MissingOrEmptyDataIsAUsageError) {
  EXPECT_THROW(open_training_data("/nonexistent/corpus", "", 0.1, *kBytes), UsageError);
  EXPECT_THROW(open_training_data("/nonexistent/shards_*.bin", "", 0.1, *kBytes), UsageError);
  const std::string empty = testing::TempDir() + "trident_empty_dataset";
  {
    IndexedDatasetWriter w(empty, TokenType::uint16);
    w.finish();  // a valid dataset of no documents
  }
  try {
    open_training_data(empty, "", 0.1, *kBytes);
    FAIL() << "trained on an empty dataset";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no tokens"), std::string::npos) << e.what();
  }
}

// An llm.c shard as dev/data/data_common.py writes it.
void write_llmc_shard(const std::string& path, const std::vector<uint32_t>& tokens, bool llama3) {
  std::vector<int32_t> header(256, 0);
  header[0] = llama3 ? 20240801 : 20240520;
  header[1] = llama3 ? 7 : 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (uint32_t t : tokens) out.write(reinterpret_cast<const char*>(&t), llama3 ? 4 : 2);
}

TEST(TrainingData, LlmcShardsWithTheirValidationShard) {
  const std::string dir = testing::TempDir() + "trident_llmc";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // EOT (50256) first in every document, as fineweb.py writes; shard 0 is validation.
  write_llmc_shard(dir + "/fw_val_000000.bin", {50256, 7, 8, 9, 50256, 10, 11}, false);
  write_llmc_shard(dir + "/fw_train_000001.bin", {50256, 1, 2, 3, 50256, 4}, false);
  write_llmc_shard(dir + "/fw_train_000002.bin", {5, 50256, 6}, false);  // a document across shards
  const TrainingData d = open_training_data(dir + "/fw_*.bin", "", 0.5, *kBytes);
  ASSERT_EQ(d.train.ranges.size(), 1u);
  EXPECT_EQ(d.train.tokens(), 9u);
  EXPECT_EQ(d.val.tokens(), 7u);
  EXPECT_EQ(d.max_token, 50256);
  std::vector<int32_t> t(9);
  d.train.ranges[0].dataset->read(0, 9, t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{50256, 1, 2, 3, 50256, 4, 5, 50256, 6}));
  EXPECT_EQ(d.train.ranges[0].dataset->document_starts(), (std::vector<uint64_t>{0, 4, 7}));
  // Llama 3's uint32 shards.
  write_llmc_shard(dir + "/l3_000000.bin", {128000, 70000, 128000, 5}, true);
  const TrainingData l3 = open_training_data(dir + "/l3_*.bin", "", 0.5, *kBytes);
  EXPECT_EQ(l3.max_token, 128000);
  EXPECT_EQ(l3.val.tokens(), 2u);  // the second of two documents
  // A shard shorter than its header says, and a wrong magic.
  std::ofstream(dir + "/bad_000000.bin", std::ios::binary | std::ios::app).write("xx", 2);
  write_llmc_shard(dir + "/cut_000000.bin", {1, 2, 3}, false);
  fs::resize_file(dir + "/cut_000000.bin", 1024 + 4);
  try {
    open_training_data(dir + "/cut_*.bin", "", 0.1, *kBytes);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cut_000000.bin: the header says 3 tokens"), std::string::npos) << e.what();
  }
  try {
    open_training_data(dir + "/bad_*.bin", "", 0.1, *kBytes);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_000000.bin"), std::string::npos) << e.what();
  }
}

TEST(TrainingData, MegatronDatasetsBlendAndValidateApart) {
  const std::string a = testing::TempDir() + "trident_blend_a", b = testing::TempDir() + "trident_blend_b";
  for (const auto& [prefix, base] : {std::pair{a, 1000}, std::pair{b, 2000}}) {
    IndexedDatasetWriter w(prefix, TokenType::uint16);
    for (int doc = 0; doc < 20; doc++) {
      std::vector<int32_t> tokens(50);
      for (int i = 0; i < 50; i++) tokens[i] = base + doc;
      w.add_document(tokens);
    }
    w.finish();
  }
  const TrainingData d = open_training_data("0.75 " + a + " 0.25 " + b, "", 0.1, *kBytes);
  ASSERT_EQ(d.train.ranges.size(), 2u);
  EXPECT_DOUBLE_EQ(d.train.weights[0], 0.75);
  EXPECT_EQ(d.train.ranges[0].size(), 18u * 50);  // 2 of 20 documents held out
  EXPECT_EQ(d.val.ranges[1].size(), 2u * 50);
  // Sequences come from each dataset in proportion to its weight.
  const BatchSampler s(d.train, 16, 7, 1);
  std::vector<int32_t> in, tg;
  s.fill(0, 0, 4000, in, tg);
  int from_a = 0;
  for (int i = 0; i < 4000; i++) from_a += in[i * 16] < 2000;
  EXPECT_NEAR(from_a / 4000.0, 0.75, 0.03);
  // No training sequence reaches a held-out document.
  for (int i = 0; i < 4000 * 16; i++) EXPECT_LT(in[i] % 1000, 18) << i;
  // The validation split can be a dataset of its own.
  const TrainingData v = open_training_data(a, b, 0.1, *kBytes);
  EXPECT_EQ(v.train.tokens(), 20u * 50);
  EXPECT_EQ(v.val.tokens(), 20u * 50);
  EXPECT_THROW(open_training_data("0.5 " + a + " -1 " + b, "", 0.1, *kBytes), UsageError);
  // One file of the pair named in place of its prefix: the message says what to pass.
  for (const std::string& one : {a + ".bin", a + ".idx"}) {
    try {
      open_training_data(one, "", 0.1, *kBytes);
      FAIL() << one << " was read";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("pass the prefix, --data.path=" + a), std::string::npos) << e.what();
    }
  }
  // The folder holding prepared datasets (with prepare's .json beside them) in place of a
  // prefix: the same help, not a parse of their bytes as text.
  const std::string folder = testing::TempDir() + "trident_prepared_folder";
  fs::remove_all(folder);
  fs::create_directories(folder);
  for (const std::string name : {"web", "code"}) {
    IndexedDatasetWriter w(folder + "/" + name, TokenType::uint16);
    w.add_document(std::vector<int32_t>(50, 7));
    w.finish();
    std::ofstream(folder + "/" + name + ".json") << "{\"tokenizer\": \"byte\"}\n";
    const auto error_of = [&](const std::string& path) {
      try {
        open_training_data(path, "", 0.1, *kBytes);
      } catch (const UsageError& e) {
        return std::string(e.what());
      }
      return std::string("read");
    };
    if (name == "web") {  // one dataset there
      EXPECT_EQ(error_of(folder), "data.path '" + folder + "' is a folder holding the Megatron indexed dataset '" +
                                      folder + "/web' (.bin + .idx): pass the prefix, --data.path=" + folder + "/web");
    } else {
      EXPECT_EQ(error_of(folder + "/"), "data.path '" + folder + "/' is a folder holding 2 Megatron indexed datasets ('" +
                                            folder + "/code', '" + folder + "/web'): pass a prefix, --data.path=" +
                                            folder + "/code, or a blend of them, --data.path='1 " + folder + "/code 1 " +
                                            folder + "/web'");
    }
  }
}

// JSONL as data.path is read as `trident prepare` reads it: a document per line under
// data.json_key (not its JSON syntax as text).
TEST(TrainingData, JsonlIsADocumentPerLine) {
  const std::string dir = testing::TempDir() + "trident_jsonl";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/docs.jsonl") << "{\"text\": \"one\", \"id\": 1}\n{\"text\": \"two two\"}\n\n{\"body\": \"x\", \"text\": \"three\"}\n";
  const TrainingData d = open_training_data(dir + "/docs.jsonl", "", 0.0, *kBytes);
  EXPECT_EQ(d.documents, 3u);
  EXPECT_EQ(text_of(d.train.ranges[0]), "onetwo twothree");
  std::ofstream(dir + "/keyed.jsonl") << "{\"body\": \"x\"}\n{\"body\": \"yz\"}\n";
  const TrainingData other_key = open_training_data(dir + "/keyed.jsonl", "", 0.0, *kBytes, "body");
  EXPECT_EQ(text_of(other_key.train.ranges[0]), "xyz");
  std::ofstream(dir + "/bad.jsonl") << "{\"text\": \"fine\"}\nnot json\n";
  try {
    open_training_data(dir + "/bad.jsonl", "", 0.0, *kBytes);
    FAIL() << "a line that is not JSON was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl: line 2"), std::string::npos) << e.what();
  }
}

TEST(BatchSampler, DeterministicAndSliceable) {
  std::vector<int32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>(i * 7 % 251);
  const auto data = in_memory_dataset(tokens, {0}, "test", "test");
  Split split;
  split.ranges = {{data.get(), 0, data->tokens()}};
  split.weights = {1.0};
  const BatchSampler s(split, 16, 42, 1);
  std::vector<int32_t> in_all, tg_all, in_part, tg_part, in_other, tg_other;
  s.fill(5, 0, 8, in_all, tg_all);
  s.fill(5, 4, 4, in_part, tg_part);  // what a second data-parallel rank would take
  EXPECT_TRUE(std::equal(in_part.begin(), in_part.end(), in_all.begin() + 4 * 16));
  for (int i = 0; i < 8 * 16; i++) {
    if (i % 16 != 15) {
      EXPECT_EQ(tg_all[i], in_all[i + 1]);  // targets are inputs shifted by one
    }
  }
  s.fill(6, 0, 8, in_other, tg_other);
  EXPECT_NE(in_all, in_other);  // another step, another batch
  const BatchSampler same(split, 16, 42, 1), other_seed(split, 16, 43, 1);
  same.fill(5, 0, 8, in_other, tg_other);
  EXPECT_EQ(in_all, in_other);
  other_seed.fill(5, 0, 8, in_other, tg_other);
  EXPECT_NE(in_all, in_other);
}

TEST(BatchSampler, TooLittleTextIsAUsageError) {
  const auto data = in_memory_dataset(std::vector<int32_t>(10), {0}, "test", "test");
  Split split;
  split.ranges = {{data.get(), 0, data->tokens()}};
  split.weights = {1.0};
  EXPECT_THROW(BatchSampler(split, 16, 1, 1), UsageError);
}

}  // namespace
}  // namespace trident
