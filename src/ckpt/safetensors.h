// safetensors (Hugging Face's weight format), read memory-mapped and written byte-exact:
// u64 little-endian N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"}, ...,
// "__metadata__": {string: string}}, then the data buffer, row-major, little-endian.
// The header is untrusted input: every rule of the format is checked (size limit, JSON
// object, known dtypes, shapes agreeing with byte counts, offsets in range, contiguous
// and covering the buffer, no duplicate names) and a violation is one UsageError naming
// the file; nothing is read outside the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trident {

struct SafetensorsTensor {
  std::string name, dtype;  // dtype as the format spells it: F32, BF16, F16, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // n elements of a F32, BF16 or F16 tensor as floats, starting at flat element `first`
  // and `stride` elements apart (1: contiguous). UsageError for other dtypes.
  void read(const SafetensorsTensor& t, int64_t first, int64_t n, float* out, int64_t stride = 1) const;
  // Maps the pages of flat elements [first, first + n) in one call (MADV_POPULATE_READ)
  // rather than one page fault at a time; a hint: ignored where the kernel lacks it.
  void prefetch(const SafetensorsTensor& t, int64_t first, int64_t n) const;
  // Drops the tensor's pages from this process (they stay in the page cache), so that
  // reading a whole model one tensor at a time never holds more than one mapped.
  void release(const SafetensorsTensor& t) const;

 private:
  std::string path_;
  int fd_ = -1;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  const unsigned char* data_ = nullptr;  // the data buffer, after the header
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: float values stored as `dtype` (F32 or BF16, round to nearest even).
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  const float* values = nullptr;
};
// Writes entries in the given order (data contiguous, header padded with spaces to a
// multiple of 8, as the reference writer does), with `metadata` as __metadata__.
// Returns the bytes of tensor data written.
uint64_t write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                           const std::string& dtype, const std::map<std::string, std::string>& metadata);

// Bits per element of a dtype the format knows (F4: 4, BF16: 16, ...); 0 if unknown.
int safetensors_dtype_bits(const std::string& dtype);

}  // namespace trident
