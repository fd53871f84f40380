// TFRecord, the framing of TensorBoard's event files: per record a little-endian uint64
// length, the masked CRC-32C of those 8 bytes, the bytes, and their masked CRC-32C.
// CRC-32C (Castagnoli) comes from Boost.CRC.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace trident {

// TensorFlow's mask: rotated right by 15 bits plus a constant, so that a CRC of data
// that holds CRCs stays well distributed.
uint32_t masked_crc32c(std::string_view bytes);

class TfRecordWriter {
 public:
  // Creates `path` (an existing file is replaced); UsageError naming it when it cannot.
  explicit TfRecordWriter(const std::string& path);
  TfRecordWriter(const TfRecordWriter&) = delete;
  ~TfRecordWriter();
  void write(std::string_view record);
  // What was written reaches the file (a killed run keeps it).
  void flush();
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return bytes_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace trident
