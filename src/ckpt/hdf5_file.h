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

  int64_t attr_int(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::string attr_string(const std::string& name) const;

  std::vector<int64_t> shape(const std::string& dataset) const;
  std::vector<double> read_double(const std::string& dataset) const;
  std::vector<float> read_float(const std::string& dataset) const;
  std::vector<int32_t> read_int32(const std::string& dataset) const;

 private:
  template <typename T>
  std::vector<T> read(const std::string& dataset, hid_t memtype) const;
  hid_t open_attr(const std::string& name) const;

  std::string path_;
  hid_t file_ = -1;
};

}  // namespace trident
