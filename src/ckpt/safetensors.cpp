#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/bf16.h"
#include "kernels/base/error.h"

namespace trident {

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's MAX_HEADER_SIZE

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) bits = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  else if (exponent != 0) bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  else if (mantissa == 0) bits = sign;
  else {  // subnormal: normalize
    int e = -1;
    uint32_t m = mantissa;
    do {
      e++;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int safetensors_dtype_bits(const std::string& d) {
  static const std::map<std::string, int> bits = {
      {"BOOL", 8},   {"F4", 4},     {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
      {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},   {"F16", 16},   {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"C64", 64},   {"F64", 64},   {"I64", 64},    {"U64", 64}};
  const auto it = bits.find(d);
  return it == bits.end() ? 0 : it->second;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const auto bad = [&](const std::string& why) { return UsageError(path + ": not a valid safetensors file: " + why); };
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require(fd_ >= 0, "cannot read '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd_);
    throw UsageError("'" + path + "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  try {
    if (size_ < 8) throw bad("shorter than its 8-byte header length (" + std::to_string(size_) + " bytes)");
    void* m = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) throw UsageError("cannot map '" + path + "': " + std::strerror(errno));
    map_ = static_cast<const unsigned char*>(m);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | map_[i];
    if (n > kMaxHeader) throw bad("header length " + std::to_string(n) + " above the limit of 100000000");
    if (n > size_ - 8) throw bad("header length " + std::to_string(n) + " runs past the end of the file (" +
                                 std::to_string(size_) + " bytes): truncated?");
    if (n < 2 || map_[8] != '{') throw bad("the header does not start with '{'");
    data_ = map_ + 8 + n;
    const uint64_t buffer = size_ - 8 - n;

    // Duplicate names: the parser would keep the last silently, so they are caught here.
    std::set<std::string> seen;
    std::string duplicate;
    const nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event,
                                                     nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      // The format nests 3 deep ({name: {shape: [..]}}); deeper is an attack on the parser.
      if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
          depth > 3)
        throw bad("the header nests deeper than the format does");
      return true;
    };
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(map_ + 8, map_ + 8 + n, cb);
    } catch (const nlohmann::json::exception& e) {
      throw bad(std::string("the header is not JSON: ") + e.what());
    }
    if (!duplicate.empty()) throw bad("tensor '" + duplicate + "' appears twice in the header");
    if (!header.is_object()) throw bad("the header is not a JSON object");
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) throw bad("__metadata__ is not an object");
        for (const auto& [k, v] : entry.items()) {
          if (!v.is_string()) throw bad("__metadata__['" + k + "'] is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string where = "tensor '" + name + "': ";
      if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
        throw bad(where + "expected an object with dtype, shape and data_offsets");
      SafetensorsTensor t;
      t.name = name;
      if (!entry["dtype"].is_string()) throw bad(where + "dtype is not a string");
      t.dtype = entry["dtype"].get<std::string>();
      const int bits = safetensors_dtype_bits(t.dtype);
      if (bits == 0) throw bad(where + "unknown dtype '" + t.dtype + "'");
      if (!entry["shape"].is_array()) throw bad(where + "shape is not an array");
      unsigned __int128 numel = 1;
      for (const auto& d : entry["shape"]) {
        if (!d.is_number_unsigned()) throw bad(where + "shape holds a value that is not a non-negative integer");
        const uint64_t dim = d.get<uint64_t>();
        numel *= dim;
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            numel > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()))
          throw bad(where + "shape too large");
        t.shape.push_back(static_cast<int64_t>(dim));
      }
      const auto& off = entry["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad(where + "data_offsets is not [begin, end]");
      t.begin = off[0].get<uint64_t>();
      t.end = off[1].get<uint64_t>();
      if (t.end < t.begin) throw bad(where + "data_offsets end before they begin");
      if (t.end > buffer)
        throw bad(where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  "] run past the data buffer of " + std::to_string(buffer) + " bytes: truncated?");
      const unsigned __int128 bytes_bits = numel * static_cast<unsigned>(bits);
      if (bytes_bits % 8 != 0 || bytes_bits / 8 != t.end - t.begin)
        throw bad(where + "shape and dtype " + t.dtype + " need " +
                  std::to_string(static_cast<uint64_t>(bytes_bits / 8)) + " bytes, data_offsets hold " +
                  std::to_string(t.end - t.begin));
      tensors_.push_back(std::move(t));
    }
    // The buffer must be covered exactly, without holes or overlaps.
    std::vector<const SafetensorsTensor*> by_offset;
    for (const SafetensorsTensor& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t at = 0;
    for (const SafetensorsTensor* t : by_offset) {
      if (t->begin != at)
        throw bad("tensor '" + t->name + "' starts at byte " + std::to_string(t->begin) + ", expected " +
                  std::to_string(at) + (t->begin < at ? " (overlaps the one before)" : " (a hole before it)"));
      at = t->end;
    }
    if (at != buffer)
      throw bad("the tensors cover " + std::to_string(at) + " of the data buffer's " + std::to_string(buffer) + " bytes");
  } catch (...) {
    if (map_ != nullptr) munmap(const_cast<unsigned char*>(map_), size_);
    close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(const_cast<unsigned char*>(map_), size_);
  if (fd_ >= 0) close(fd_);
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsFile::read(const SafetensorsTensor& t, int64_t first, int64_t n, float* out, int64_t stride) const {
  require(n == 0 || (first >= 0 && stride >= 1 && first + (n - 1) * stride < t.numel()),
          path_ + ": " + t.name + ": read outside the tensor");
  const unsigned char* base = data_ + t.begin;
  if (t.dtype == "F32" && stride == 1) {
    std::memcpy(out, base + 4 * first, 4 * n);  // little-endian hosts
  } else if (t.dtype == "F32") {
    for (int64_t i = 0; i < n; i++) std::memcpy(out + i, base + 4 * (first + i * stride), 4);
  } else if (t.dtype == "BF16") {
    for (int64_t i = 0; i < n; i++) {
      uint16_t b;
      std::memcpy(&b, base + 2 * (first + i * stride), 2);
      out[i] = kernels::bf16_bits_to_float(b);
    }
  } else if (t.dtype == "F16") {
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      std::memcpy(&h, base + 2 * (first + i * stride), 2);
      out[i] = half_to_float(h);
    }
  } else {
    throw UsageError(path_ + ": " + t.name + " is " + t.dtype + ": weights must be F32, BF16 or F16");
  }
}

void SafetensorsFile::prefetch(const SafetensorsTensor& t, int64_t first, int64_t n) const {
#ifdef MADV_POPULATE_READ
  const int bits = safetensors_dtype_bits(t.dtype);
  const long page = sysconf(_SC_PAGESIZE);
  const uint64_t from = t.begin + static_cast<uint64_t>(first) * bits / 8;
  const uint64_t to = std::min<uint64_t>(t.end, t.begin + static_cast<uint64_t>(first + n) * bits / 8);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_ + from) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_ + to);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)t, (void)first, (void)n;
#endif
}

void SafetensorsFile::release(const SafetensorsTensor& t) const {
  const long page = sysconf(_SC_PAGESIZE);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_ + t.begin) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_ + t.end);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

uint64_t write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                           const std::string& dtype, const std::map<std::string, std::string>& metadata) {
  require(dtype == "F32" || dtype == "BF16", "safetensors export: dtype must be F32 or BF16, not " + dtype);
  const uint64_t element = dtype == "F32" ? 4 : 2;
  // ordered_json: the header lists the tensors in data order, __metadata__ first.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  std::vector<int64_t> numels;
  for (const SafetensorsEntry& e : entries) {
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    numels.push_back(numel);
    header[e.name] = {{"dtype", dtype}, {"shape", e.shape}, {"data_offsets", {at, at + numel * element}}};
    at += numel * element;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(out.good(), "cannot write '" + path + "'");
  unsigned char length[8];
  for (int i = 0; i < 8; i++) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<char> buffer;
  for (size_t i = 0; i < entries.size(); i++) {
    const SafetensorsEntry& e = entries[i];
    const int64_t numel = numels[i];
    if (element == 4) {  // little-endian hosts (x86-64, aarch64): the floats as they are
      out.write(reinterpret_cast<const char*>(e.values), static_cast<std::streamsize>(numel * 4));
      continue;
    }
    buffer.resize(static_cast<size_t>(numel) * element);
    for (int64_t j = 0; j < numel; j++) {
      const uint16_t b = kernels::float_to_bf16_bits(e.values[j]);
      std::memcpy(buffer.data() + 2 * j, &b, 2);
    }
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  }
  out.flush();
  require(out.good(), "writing '" + path + "' failed (disk full?)");
  return at;
}

}  // namespace trident
