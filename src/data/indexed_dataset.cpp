#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, two counts

// Megatron's dtype codes (DType in indexed_dataset.py).
uint8_t megatron_code(TokenType t) {
  switch (t) {
    case TokenType::uint8: return 1;
    case TokenType::int8: return 2;
    case TokenType::int16: return 3;
    case TokenType::int32: return 4;
    case TokenType::int64: return 5;
    case TokenType::uint16: return 8;
    case TokenType::uint32: break;
  }
  throw UsageError("Megatron's indexed dataset has no uint32 tokens (int32 holds every vocabulary)");
}

TokenType from_megatron_code(uint8_t code, const std::string& file) {
  switch (code) {
    case 1: return TokenType::uint8;
    case 2: return TokenType::int8;
    case 3: return TokenType::int16;
    case 4: return TokenType::int32;
    case 5: return TokenType::int64;
    case 8: return TokenType::uint16;
  }
  throw UsageError(file + ": dtype code " + std::to_string(code) +
                   " at byte 17 is not a token type (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6 and 7 "
                   "are floats)");
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // x86-64 is little-endian, like the format
  return v;
}

}  // namespace

size_t token_bytes(TokenType t) {
  switch (t) {
    case TokenType::uint8:
    case TokenType::int8: return 1;
    case TokenType::int16:
    case TokenType::uint16: return 2;
    case TokenType::int32:
    case TokenType::uint32: return 4;
    case TokenType::int64: return 8;
  }
  return 0;
}

const char* token_type_name(TokenType t) {
  static const char* names[] = {"uint8", "int8", "int16", "int32", "int64", "uint16", "uint32"};
  return names[static_cast<int>(t)];
}

TokenType token_type_for_vocabulary(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenType::uint16 : TokenType::int32;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = open(path.c_str(), O_RDONLY);
  require(fd >= 0, "cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      throw UsageError("cannot memory-map '" + path + "': " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void decode_tokens(const uint8_t* bytes, TokenType type, size_t count, int32_t* out) {
  switch (type) {
    case TokenType::uint8:
      for (size_t i = 0; i < count; i++) out[i] = bytes[i];
      break;
    case TokenType::int8:
      for (size_t i = 0; i < count; i++) out[i] = static_cast<int8_t>(bytes[i]);
      break;
    case TokenType::uint16:
      for (size_t i = 0; i < count; i++) out[i] = read_le<uint16_t>(bytes + 2 * i);
      break;
    case TokenType::int16:
      for (size_t i = 0; i < count; i++) out[i] = read_le<int16_t>(bytes + 2 * i);
      break;
    case TokenType::int32:
      std::memcpy(out, bytes, count * 4);
      break;
    case TokenType::uint32:
      for (size_t i = 0; i < count; i++) out[i] = static_cast<int32_t>(read_le<uint32_t>(bytes + 4 * i));
      break;
    case TokenType::int64:
      for (size_t i = 0; i < count; i++) out[i] = static_cast<int32_t>(read_le<int64_t>(bytes + 8 * i));
      break;
  }
}

// ---- reading --------------------------------------------------------------------------

namespace {

class MappedTokens final : public TokenBytes {
 public:
  explicit MappedTokens(const std::string& path) : file_(path) {}
  uint64_t size() const override { return file_.size(); }
  const uint8_t* bytes(uint64_t offset, size_t, std::vector<uint8_t>&) const override { return file_.data() + offset; }

 private:
  MappedFile file_;
};

}  // namespace

std::unique_ptr<TokenBytes> map_token_file(const std::string& path) { return std::make_unique<MappedTokens>(path); }

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  require(fs::exists(idx_path), "data.path '" + prefix + "': no index " + idx_path);
  require(fs::exists(bin_path), "data.path '" + prefix + "': no token file " + bin_path);
  const MappedFile idx(idx_path);
  parse_index(idx_path, idx.data(), idx.size());
  bin_ = map_token_file(bin_path);
  check_token_file(bin_path);
}

IndexedDataset::IndexedDataset(const std::string& name, const uint8_t* idx, size_t idx_size,
                               std::unique_ptr<TokenBytes> bin)
    : prefix_(name), bin_(std::move(bin)) {
  parse_index(name + ".idx", idx, idx_size);
  check_token_file(name + ".bin");
}

void IndexedDataset::check_token_file(const std::string& bin_name) const {
  require(bin_->size() >= tokens() * token_bytes(type_), bin_name + " has " + std::to_string(bin_->size()) +
                                                             " bytes, shorter than the " +
                                                             std::to_string(tokens() * token_bytes(type_)) +
                                                             " its index says (truncated?)");
}

void IndexedDataset::parse_index(const std::string& idx_path, const uint8_t* p, size_t size) {
  require(size >= kHeaderBytes, idx_path + ": " + std::to_string(size) + " bytes, shorter than the " +
                                    std::to_string(kHeaderBytes) + "-byte header (truncated?)");
  require(std::memcmp(p, kMagic, 9) == 0, idx_path + ": not a Megatron indexed dataset (the magic at byte 0 is not MMIDIDX)");
  const uint64_t version = read_le<uint64_t>(p + 9);
  require(version == 1, idx_path + ": version " + std::to_string(version) + " at byte 9, only version 1 is known");
  type_ = from_megatron_code(p[17], idx_path);
  const uint64_t sequences = read_le<uint64_t>(p + 18), doc_entries = read_le<uint64_t>(p + 26);
  // The counts must fit the file before anything is allocated from them.
  const uint64_t arrays = 12 * sequences + 8 * doc_entries;
  require(sequences < (uint64_t{1} << 40) && doc_entries < (uint64_t{1} << 40) && doc_entries >= 1 &&
              size >= kHeaderBytes + arrays,
          idx_path + ": " + std::to_string(sequences) + " sequences and " + std::to_string(doc_entries) +
              " document indices need " + std::to_string(kHeaderBytes + arrays) + " bytes, the file has " +
              std::to_string(size) + " (truncated?)");
  lengths_.resize(sequences);
  std::memcpy(lengths_.data(), p + kHeaderBytes, 4 * sequences);
  const uint8_t* pointers = p + kHeaderBytes + 4 * sequences;
  document_indices_.resize(doc_entries);
  std::memcpy(document_indices_.data(), pointers + 8 * sequences, 8 * doc_entries);
  // Lengths non-negative and pointers their running sum: one contiguous run of tokens.
  const size_t item = token_bytes(type_);
  token_starts_.resize(sequences + 1, 0);
  for (uint64_t i = 0; i < sequences; i++) {
    const int64_t pointer = read_le<int64_t>(pointers + 8 * i);
    // The messages are built only on failure (this runs for every sequence).
    if (lengths_[i] < 0) throw UsageError(idx_path + ": sequence " + std::to_string(i) + " has a negative length");
    if (pointer != static_cast<int64_t>(token_starts_[i] * item))
      throw UsageError(idx_path + ": the pointer of sequence " + std::to_string(i) + " (at byte " +
                       std::to_string(kHeaderBytes + 4 * sequences + 8 * i) + ") is " + std::to_string(pointer) +
                       ", not the end of the sequences before it (" + std::to_string(token_starts_[i] * item) + ")");
    token_starts_[i + 1] = token_starts_[i] + static_cast<uint64_t>(lengths_[i]);
  }
  require(document_indices_.front() == 0 && document_indices_.back() == static_cast<int64_t>(sequences) &&
              std::is_sorted(document_indices_.begin(), document_indices_.end()),
          idx_path + ": document indices must rise from 0 to the sequence count");
}

void IndexedDataset::read(uint64_t begin, size_t count, int32_t* out) const {
  check(begin + count <= tokens(), "IndexedDataset::read past the end");
  const size_t item = token_bytes(type_);
  decode_tokens(bin_->bytes(begin * item, count * item, scratch_), type_, count, out);
}

void IndexedDataset::prefetch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, bool in_background) const {
  const size_t item = token_bytes(type_);
  std::vector<std::pair<uint64_t, uint64_t>> bytes;
  for (const auto& [begin, count] : ranges) bytes.emplace_back(begin * item, count * item);
  if (in_background) bin_->prefetch_in_background(bytes);
  else bin_->prefetch(bytes);
}

int64_t IndexedDataset::max_token() const {
  if (max_token_ >= 0 || tokens() == 0 || !bin_->local()) return max_token_;
  std::vector<int32_t> chunk(1 << 20);
  int64_t m = 0;
  for (uint64_t at = 0; at < tokens(); at += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), tokens() - at));
    read(at, n, chunk.data());
    for (size_t i = 0; i < n; i++) {
      if (chunk[i] < 0) throw UsageError(prefix_ + ".bin: a negative token id at token " + std::to_string(at + i));
      m = std::max<int64_t>(m, chunk[i]);
    }
  }
  return max_token_ = m;
}

// ---- writing --------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenType type) : prefix_(prefix), type_(type) {
  megatron_code(type);  // a type the format can hold
  const std::string tmp = prefix + ".bin.tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  require(bin_ != nullptr, "cannot write '" + tmp + "': " + std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
  if (!finished_) {
    std::error_code ignored;
    fs::remove(prefix_ + ".bin.tmp", ignored);
    fs::remove(prefix_ + ".idx.tmp", ignored);
  }
}

void IndexedDatasetWriter::write_bytes(const void* data, size_t bytes) {
  require(std::fwrite(data, 1, bytes, bin_) == bytes, "cannot write '" + prefix_ + ".bin.tmp' (disk full?)");
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  check(!finished_, "add_document after finish");
  const size_t item = token_bytes(type_);
  buffer_.resize(tokens.size() * item);
  for (size_t i = 0; i < tokens.size(); i++) {
    const int64_t id = tokens[i];
    const bool fits = type_ == TokenType::uint16 ? id >= 0 && id < 65536 : id >= 0;
    require(fits, "token id " + std::to_string(id) + " does not fit the dataset's " + token_type_name(type_));
    std::memcpy(buffer_.data() + i * item, &id, item);  // the low bytes: little-endian
  }
  write_bytes(buffer_.data(), buffer_.size());
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  tokens_ += tokens.size();
}

void IndexedDatasetWriter::add_dataset(const IndexedDataset& other) {
  require(other.type() == type_, other.prefix() + " stores " + token_type_name(other.type()) + " tokens, not " +
                                     token_type_name(type_));
  check(other.sequences() == other.documents(), "add_dataset: one sequence per document");
  std::vector<int32_t> tokens;
  for (size_t s = 0; s < other.sequences(); s++) {
    tokens.resize(other.sequence_start(s + 1) - other.sequence_start(s));
    other.read(other.sequence_start(s), tokens.size(), tokens.data());
    add_document(tokens);
  }
}

void IndexedDatasetWriter::finish() {
  check(!finished_, "finish twice");
  const auto sync_close = [](std::FILE*& f, const std::string& path) {
    const bool ok = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
    std::fclose(f);
    f = nullptr;
    require(ok, "cannot write '" + path + "' (disk full?)");
  };
  sync_close(bin_, prefix_ + ".bin.tmp");
  const std::string idx_tmp = prefix_ + ".idx.tmp";
  std::FILE* idx = std::fopen(idx_tmp.c_str(), "wb");
  require(idx != nullptr, "cannot write '" + idx_tmp + "': " + std::strerror(errno));
  std::vector<uint8_t> out(kHeaderBytes);
  const uint64_t version = 1, sequences = lengths_.size(), documents = lengths_.size() + 1;
  const uint8_t code = megatron_code(type_);
  std::memcpy(out.data(), kMagic, 9);
  std::memcpy(out.data() + 9, &version, 8);
  out[17] = code;
  std::memcpy(out.data() + 18, &sequences, 8);
  std::memcpy(out.data() + 26, &documents, 8);
  const auto append = [&out](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  append(lengths_.data(), 4 * lengths_.size());
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    append(&pointer, 8);
    pointer += static_cast<int64_t>(length) * static_cast<int64_t>(token_bytes(type_));
  }
  for (int64_t d = 0; d <= static_cast<int64_t>(lengths_.size()); d++) append(&d, 8);
  const bool wrote = std::fwrite(out.data(), 1, out.size(), idx) == out.size();
  require(wrote, "cannot write '" + idx_tmp + "' (disk full?)");
  sync_close(idx, idx_tmp);
  fs::rename(prefix_ + ".bin.tmp", prefix_ + ".bin");
  fs::rename(idx_tmp, prefix_ + ".idx");  // the index last: a dataset counts once it has one
  finished_ = true;
}

}  // namespace trident
