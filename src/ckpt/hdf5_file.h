// A small RAII reader over the HDF5 C API: attributes and whole datasets, converted
// by HDF5 to the requested type. Missing objects and bad files are UsageErrors that
// name the file and the object.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trident {

class Hdf5Reader {
 public:
  explicit Hdf5Reader(const std::string& path);
  ~Hdf5Reader();
  Hdf5Reader(const Hdf5Reader&) = delete;
  Hdf5Reader& operator=(const Hdf5Reader&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& object) const;
  bool has_attr(const std::string& name, const std::string& object = "/") const;

  // Attributes of the root group.
  int64_t attr_int(const std::string& name) const { return attr_int("/", name); }
  double attr_double(const std::string& name) const { return attr_double("/", name); }
  std::string attr_string(const std::string& name) const { return attr_string("/", name); }

  std::vector<int64_t> shape(const std::string& dataset) const;
  std::vector<int64_t> attr_ints(const std::string& object, const std::string& name) const;
  // Attributes of `object` (a group or dataset path).
  int64_t attr_int(const std::string& object, const std::string& name) const;
  double attr_double(const std::string& object, const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;
  // Names of the members of a group ("/" for the root).
  std::vector<std::string> members(const std::string& group) const;
  std::vector<double> read_double(const std::string& dataset) const;
  std::vector<float> read_float(const std::string& dataset) const;
  std::vector<int32_t> read_int32(const std::string& dataset) const;

 private:
  template <typename T>
  std::vector<T> read(const std::string& dataset, hid_t memtype) const;
  hid_t open_attr(const std::string& object, const std::string& name) const;

  std::string path_;
  hid_t file_ = -1;
};

// A small RAII writer: creates (truncates) a file; datasets of floats with their
// groups, and attributes on the root or on a dataset. Failures (a full disk, a file-size
// limit) are UsageErrors naming the file.
class Hdf5Writer {
 public:
  explicit Hdf5Writer(const std::string& path);
  ~Hdf5Writer();
  Hdf5Writer(const Hdf5Writer&) = delete;
  Hdf5Writer& operator=(const Hdf5Writer&) = delete;

  void write_floats(const std::string& dataset, const float* data, const std::vector<int64_t>& shape);
  // Attributes on `object` ("/" for the root).
  void attr(const std::string& object, const std::string& name, int64_t value);
  void attr(const std::string& object, const std::string& name, double value);
  void attr(const std::string& object, const std::string& name, const std::string& value);
  void attr(const std::string& object, const std::string& name, const std::vector<int64_t>& value);
  // Flushes and closes; throws on failure (the destructor only closes quietly).
  void close();

 private:
  void ensure_groups(const std::string& dataset);
  std::string path_;
  hid_t file_ = -1;
};

}  // namespace trident
