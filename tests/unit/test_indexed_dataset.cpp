// Megatron's indexed dataset byte for byte (shared/reference/DATA_FORMATS.md 3b: the
// example there was checked against Megatron's own writer), read back, appended, and
// every damage to it one clear error naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/indexed_dataset.h"
#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {
namespace {

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string error_of(const std::string& prefix) {
  try {
    IndexedDataset d(prefix);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::string kPrefix = testing::TempDir() + "trident_idx_example";

void write_example() {
  IndexedDatasetWriter w(kPrefix, TokenType::uint16);
  w.add_document(std::vector<int32_t>{15496, 995, 50256});
  w.add_document(std::vector<int32_t>{40, 50256});
  w.finish();
}

TEST(IndexedDataset, WritesMegatronsBytesExactly) {
  write_example();
  // .bin: 10 bytes 883c e303 50c4 2800 50c4.
  EXPECT_EQ(bytes_of(kPrefix + ".bin"), (std::vector<uint8_t>{0x88, 0x3c, 0xe3, 0x03, 0x50, 0xc4, 0x28, 0x00, 0x50, 0xc4}));
  // .idx: 82 bytes: the 34-byte header (code 08, 2 sequences, 3 document indices),
  // lengths 3, 2, pointers 0, 6, document indices 0, 1, 2.
  std::vector<uint8_t> want = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 8,
                               2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0};
  for (uint32_t v : {3u, 2u})
    for (int b = 0; b < 4; b++) want.push_back(static_cast<uint8_t>(v >> (8 * b)));
  for (uint64_t v : {0ull, 6ull, 0ull, 1ull, 2ull})
    for (int b = 0; b < 8; b++) want.push_back(static_cast<uint8_t>(v >> (8 * b)));
  EXPECT_EQ(bytes_of(kPrefix + ".idx"), want);
  EXPECT_FALSE(fs::exists(kPrefix + ".bin.tmp"));
}

TEST(IndexedDataset, ReadsBackAndAppends) {
  write_example();
  const IndexedDataset d(kPrefix);
  EXPECT_EQ(d.type(), TokenType::uint16);
  EXPECT_EQ(d.sequences(), 2u);
  EXPECT_EQ(d.documents(), 2u);
  EXPECT_EQ(d.tokens(), 5u);
  EXPECT_EQ(d.sequence_start(1), 3u);
  std::vector<int32_t> t(5);
  d.read(0, 5, t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{15496, 995, 50256, 40, 50256}));
  EXPECT_EQ(d.max_token(), 50256);
  // Two copies appended: the parts of a parallel prepare merged into one dataset.
  const std::string merged = testing::TempDir() + "trident_idx_merged";
  {
    IndexedDatasetWriter w(merged, TokenType::uint16);
    w.add_dataset(d);
    w.add_dataset(d);
    w.finish();
  }
  const IndexedDataset m(merged);
  EXPECT_EQ(m.documents(), 4u);
  EXPECT_EQ(m.sequence_start(3), 8u);
  // int32 above a vocabulary of 65,500, as Megatron chooses.
  EXPECT_EQ(token_type_for_vocabulary(65499), TokenType::uint16);
  EXPECT_EQ(token_type_for_vocabulary(128256), TokenType::int32);
}

TEST(IndexedDataset, AnUnfinishedWriterLeavesNothing) {
  const std::string prefix = testing::TempDir() + "trident_idx_unfinished";
  {
    IndexedDatasetWriter w(prefix, TokenType::uint16);
    w.add_document(std::vector<int32_t>{1, 2, 3});
  }  // destroyed before finish(), as when prepare fails
  EXPECT_FALSE(fs::exists(prefix + ".bin"));
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(prefix + ".idx"));
}

TEST(IndexedDataset, DamageIsOneErrorNamingTheFile) {
  write_example();
  const std::vector<uint8_t> idx = bytes_of(kPrefix + ".idx"), bin = bytes_of(kPrefix + ".bin");
  const std::string p = testing::TempDir() + "trident_idx_damaged";
  const auto with = [&](std::vector<uint8_t> i, std::vector<uint8_t> b) {
    write_bytes(p + ".idx", i);
    write_bytes(p + ".bin", b);
    return error_of(p);
  };
  EXPECT_EQ(with(idx, bin), "");
  auto bad = idx;
  bad[0] = 'X';
  EXPECT_NE(with(bad, bin).find(".idx: not a Megatron indexed dataset"), std::string::npos);
  bad = idx;
  bad[9] = 2;
  EXPECT_NE(with(bad, bin).find("version 2"), std::string::npos);
  bad = idx;
  bad[17] = 7;  // float32
  EXPECT_NE(with(bad, bin).find("dtype code 7"), std::string::npos);
  EXPECT_NE(with({idx.begin(), idx.begin() + 60}, bin).find("truncated"), std::string::npos);
  EXPECT_NE(with({idx.begin(), idx.begin() + 20}, bin).find("shorter than the 34-byte header"), std::string::npos);
  bad = idx;
  bad[18] = 0xff;  // a sequence count far beyond the file
  EXPECT_NE(with(bad, bin).find("truncated"), std::string::npos);
  bad = idx;
  bad[34 + 8 + 8] = 5;  // the second pointer
  EXPECT_NE(with(bad, bin).find("the pointer of sequence 1"), std::string::npos);
  EXPECT_NE(with(idx, {bin.begin(), bin.begin() + 6}).find(".bin has 6 bytes"), std::string::npos);
  fs::remove(p + ".bin");
  EXPECT_NE(error_of(p).find("no token file"), std::string::npos);
  fs::remove(p + ".idx");
  EXPECT_NE(error_of(p).find("no index"), std::string::npos);
}

}  // namespace
}  // namespace trident
