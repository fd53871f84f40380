// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py, MMIDIDX v1),
// byte for byte, so that datasets written by Megatron's preprocess_data.py load as they
// are and ours load in Megatron:
//   <prefix>.bin  every sequence's tokens back to back, as the dtype, no header
//   <prefix>.idx  little-endian, unaligned: "MMIDIDX\0\0", u64 version 1, u8 dtype code,
//                 u64 sequence count, u64 document count (documents + 1),
//                 i32 lengths[sequences], i64 byte pointers[sequences],
//                 i64 document indices[documents + 1] (0, then each document's end).
// trident writes one sequence per document (Megatron's "document" level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace trident {

// How token ids are stored (Megatron's dtypes, and llm.c's uint32).
enum class TokenType { uint8, int8, int16, int32, int64, uint16, uint32 };
size_t token_bytes(TokenType t);
const char* token_type_name(TokenType t);
// Megatron's choice (DType.optimal_dtype): uint16 below a vocabulary of 65,500, int32 above.
TokenType token_type_for_vocabulary(int64_t vocab_size);

// A read-only memory map of a whole file; UsageError naming the file if it cannot be.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads token ids of `type` at `bytes` into int32s (ids must fit: checked by the readers).
void decode_tokens(const uint8_t* bytes, TokenType type, size_t count, int32_t* out);

// Where a dataset's token bytes come from: a memory-mapped file, or ranged GETs of an
// object in S3 (data/s3_stream.h).
class TokenBytes {
 public:
  virtual ~TokenBytes() = default;
  virtual uint64_t size() const = 0;
  // n bytes from `offset`: a pointer into the source, or into `scratch`, filled.
  virtual const uint8_t* bytes(uint64_t offset, size_t n, std::vector<uint8_t>& scratch) const = 0;
  // The ranges (offset, bytes) about to be read, to fetch together (a remote source); none by default.
  virtual void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const { (void)ranges; }
  // The same for ranges read later (the next step's), fetched in the background meanwhile.
  virtual void prefetch_in_background(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const { (void)ranges; }
  // What reading cost, for the log ("" for a local file).
  virtual std::string traffic() const { return ""; }
  // Whether reading everything is cheap (a local file): max_token() scans it.
  virtual bool local() const { return true; }
};

// A token file on disk, memory-mapped.
std::unique_ptr<TokenBytes> map_token_file(const std::string& path);

// An indexed dataset; every field checked against the file sizes on open.
class IndexedDataset {
 public:
  // <prefix>.idx and <prefix>.bin, memory-mapped.
  explicit IndexedDataset(const std::string& prefix);
  // The index's bytes (`name` for messages: where they came from) and the tokens' source.
  IndexedDataset(const std::string& name, const uint8_t* idx, size_t idx_size, std::unique_ptr<TokenBytes> bin);

  const std::string& prefix() const { return prefix_; }
  TokenType type() const { return type_; }
  size_t sequences() const { return lengths_.size(); }
  size_t documents() const { return document_indices_.size() - 1; }
  // Tokens of the whole dataset, and the token offset where sequence i starts.
  uint64_t tokens() const { return token_starts_.back(); }
  uint64_t sequence_start(size_t i) const { return token_starts_[i]; }
  // The sequence range [first, end) of document d.
  size_t document_first_sequence(size_t d) const { return static_cast<size_t>(document_indices_[d]); }
  // count tokens from token offset `begin` of the concatenation of all sequences.
  void read(uint64_t begin, size_t count, int32_t* out) const;
  // The token ranges (begin, count) about to be read (a remote source fetches them together).
  void prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, bool in_background = false) const;
  // The largest token id (a pass over the data the first time it is asked); -1 for a
  // remote source (not read whole: each batch's ids are checked as they are used).
  int64_t max_token() const;
  const TokenBytes& bin() const { return *bin_; }

 private:
  void parse_index(const std::string& idx_name, const uint8_t* p, size_t size);
  // The token file holds at least what the index says (UsageError naming it else).
  void check_token_file(const std::string& bin_name) const;
  std::string prefix_;
  std::unique_ptr<TokenBytes> bin_;
  mutable std::vector<uint8_t> scratch_;
  TokenType type_ = TokenType::uint16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_;
  std::vector<uint64_t> token_starts_;  // sequences + 1 entries
  mutable int64_t max_token_ = -1;
};

// Writes a dataset of whole documents, one sequence each, into <prefix>.bin/.idx.
// Files appear under their names only when finish() renames them into place, so an
// interrupted writer leaves nothing that looks complete.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenType type);
  ~IndexedDatasetWriter();  // removes the temporary files unless finished
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_document(std::span<const int32_t> tokens);
  // Appends every document of another dataset (a part of a parallel prepare), as
  // Megatron's add_index does.
  void add_dataset(const IndexedDataset& other);
  // Writes the index, syncs, renames both files into place.
  void finish();
  uint64_t tokens() const { return tokens_; }
  size_t documents() const { return lengths_.size(); }

 private:
  void write_bytes(const void* data, size_t bytes);

  std::string prefix_;
  TokenType type_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  uint64_t tokens_ = 0;
  bool finished_ = false;
  std::vector<uint8_t> buffer_;
};

}  // namespace trident
