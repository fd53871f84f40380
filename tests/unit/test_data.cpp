// The text corpus and the batch sampler: document splitting, the held-out split,
// and batches that depend only on (seed, step, index).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/text_corpus.h"
#include "runtime/error.h"

namespace trident {
namespace {

std::string make_corpus_dir() {
  const std::string dir = testing::TempDir() + "trident_corpus";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/a") << "one\n%\ntwo two\n%\nthree\n";
  std::ofstream(dir + "/b") << "four\n%\nfive\n";
  std::ofstream(dir + "/a.dat") << "binary index, skipped";
  std::ofstream(dir + "/a.u8") << "utf-8 copy, skipped";
  return dir;
}

TEST(TextCorpus, SplitsDocumentsAndHoldsOutTheLast) {
  const TextCorpus c = load_text_corpus(make_corpus_dir(), 0.2);
  EXPECT_EQ(c.files, 2u);
  EXPECT_EQ(c.documents, 5u);
  const std::string train(c.train.begin(), c.train.end()), val(c.val.begin(), c.val.end());
  EXPECT_EQ(train, "one\n%\ntwo two\n%\nthree\n%\nfour\n%\n");
  EXPECT_EQ(val, "five\n%\n");
}

TEST(TextCorpus, UnigramEntropy) {
  TextCorpus c;
  c.train = {'a', 'a', 'b', 'b'};
  EXPECT_NEAR(c.unigram_entropy(), std::log(2.0), 1e-12);
  c.train = {'a', 'a', 'a'};
  EXPECT_NEAR(c.unigram_entropy(), 0.0, 1e-12);
}

TEST(TextCorpus, MissingPathIsAUsageError) {
  EXPECT_THROW(load_text_corpus("/nonexistent/corpus", 0.1), UsageError);
}

TEST(BatchSampler, DeterministicAndSliceable) {
  std::vector<uint8_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<uint8_t>(i * 7 % 251);
  const BatchSampler s(tokens, 16, 42, 1);
  std::vector<int32_t> in_all, tg_all, in_part, tg_part, in_other, tg_other;
  s.fill(5, 0, 8, in_all, tg_all);
  s.fill(5, 4, 4, in_part, tg_part);  // what a second data-parallel rank would take
  EXPECT_TRUE(std::equal(in_part.begin(), in_part.end(), in_all.begin() + 4 * 16));
  for (int i = 0; i < 8 * 16; i++) {
    if (i % 16 != 15) EXPECT_EQ(tg_all[i], in_all[i + 1]);  // targets are inputs shifted by one
  }
  s.fill(6, 0, 8, in_other, tg_other);
  EXPECT_NE(in_all, in_other);  // another step, another batch
  const BatchSampler same(tokens, 16, 42, 1), other_seed(tokens, 16, 43, 1);
  same.fill(5, 0, 8, in_other, tg_other);
  EXPECT_EQ(in_all, in_other);
  other_seed.fill(5, 0, 8, in_other, tg_other);
  EXPECT_NE(in_all, in_other);
}

TEST(BatchSampler, TooLittleTextIsAUsageError) {
  const std::vector<uint8_t> tokens(10);
  EXPECT_THROW(BatchSampler(tokens, 16, 1, 1), UsageError);
}

}  // namespace
}  // namespace trident
