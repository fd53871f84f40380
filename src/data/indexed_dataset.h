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

// An indexed dataset, memory-mapped; every field checked against the file sizes on open.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

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
  // The largest token id (a pass over the data the first time it is asked).
  int64_t max_token() const;

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> bin_;
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
