#include "ckpt/hdf5_file.h"

#include "runtime/error.h"

namespace trident {

namespace {

// Closes an HDF5 handle at scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

}  // namespace

Hdf5Reader::Hdf5Reader(const std::string& path) : path_(path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // we report errors ourselves
  require(H5Fis_hdf5(path.c_str()) > 0,
          "cannot open '" + path + "' as an HDF5 file (missing, unreadable or not HDF5)");
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  require(file_ >= 0, "cannot open HDF5 file '" + path + "'");
}

Hdf5Reader::~Hdf5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool Hdf5Reader::has(const std::string& object) const {
  // Check each component, as H5Lexists requires for nested paths.
  size_t pos = 0;
  while (true) {
    pos = object.find('/', pos + 1);
    const std::string prefix = object.substr(0, pos);
    if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

hid_t Hdf5Reader::open_attr(const std::string& name) const {
  require(H5Aexists(file_, name.c_str()) > 0, path_ + ": missing attribute '" + name + "'");
  const hid_t attr = H5Aopen(file_, name.c_str(), H5P_DEFAULT);
  require(attr >= 0, path_ + ": cannot open attribute '" + name + "'");
  return attr;
}

int64_t Hdf5Reader::attr_int(const std::string& name) const {
  Handle attr{open_attr(name), H5Aclose};
  int64_t value = 0;
  require(H5Aread(attr.id, H5T_NATIVE_INT64, &value) >= 0, path_ + ": attribute '" + name + "' is not an integer");
  return value;
}

double Hdf5Reader::attr_double(const std::string& name) const {
  Handle attr{open_attr(name), H5Aclose};
  double value = 0;
  require(H5Aread(attr.id, H5T_NATIVE_DOUBLE, &value) >= 0, path_ + ": attribute '" + name + "' is not a number");
  return value;
}

std::string Hdf5Reader::attr_string(const std::string& name) const {
  Handle attr{open_attr(name), H5Aclose};
  Handle type{H5Aget_type(attr.id), H5Tclose};
  require(H5Tget_class(type.id) == H5T_STRING, path_ + ": attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(type.id) > 0) {
    Handle memtype{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(memtype.id, H5T_VARIABLE);
    H5Tset_cset(memtype.id, H5Tget_cset(type.id));  // h5py writes UTF-8; HDF5 won't convert
    char* value = nullptr;
    require(H5Aread(attr.id, memtype.id, &value) >= 0, path_ + ": cannot read attribute '" + name + "'");
    std::string result = value != nullptr ? value : "";
    H5free_memory(value);
    return result;
  }
  const size_t size = H5Tget_size(type.id);
  std::string value(size, '\0');
  require(H5Aread(attr.id, type.id, value.data()) >= 0, path_ + ": cannot read attribute '" + name + "'");
  return value.substr(0, value.find('\0'));
}

std::vector<int64_t> Hdf5Reader::shape(const std::string& dataset) const {
  require(has(dataset), path_ + ": missing dataset '" + dataset + "'");
  Handle set{H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose};
  require(set.id >= 0, path_ + ": cannot open dataset '" + dataset + "'");
  Handle space{H5Dget_space(set.id), H5Sclose};
  const int rank = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

template <typename T>
std::vector<T> Hdf5Reader::read(const std::string& dataset, hid_t memtype) const {
  size_t count = 1;
  for (int64_t d : shape(dataset)) count *= static_cast<size_t>(d);
  std::vector<T> values(count);
  Handle set{H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose};
  require(H5Dread(set.id, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0,
          path_ + ": cannot read dataset '" + dataset + "' (corrupt file?)");
  return values;
}

std::vector<double> Hdf5Reader::read_double(const std::string& d) const { return read<double>(d, H5T_NATIVE_DOUBLE); }
std::vector<float> Hdf5Reader::read_float(const std::string& d) const { return read<float>(d, H5T_NATIVE_FLOAT); }
std::vector<int32_t> Hdf5Reader::read_int32(const std::string& d) const { return read<int32_t>(d, H5T_NATIVE_INT32); }

}  // namespace trident
