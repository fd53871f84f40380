#include "ckpt/hdf5_file.h"

#include <algorithm>

#include "kernels/base/error.h"

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

bool Hdf5Reader::has_attr(const std::string& name, const std::string& object) const {
  return H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

hid_t Hdf5Reader::open_attr(const std::string& object, const std::string& name) const {
  const std::string where = object == "/" ? "'" + name + "'" : "'" + name + "' of '" + object + "'";
  require(H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) > 0,
          path_ + ": missing attribute " + where);
  const hid_t attr = H5Aopen_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  require(attr >= 0, path_ + ": cannot open attribute " + where);
  return attr;
}

std::vector<int64_t> Hdf5Reader::attr_ints(const std::string& object, const std::string& name) const {
  Handle attr{open_attr(object, name), H5Aclose};
  Handle space{H5Aget_space(attr.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  std::vector<int64_t> values(n > 0 ? n : 0);
  require(H5Aread(attr.id, H5T_NATIVE_INT64, values.data()) >= 0,
          path_ + ": attribute '" + name + "' is not an integer");
  return values;
}

int64_t Hdf5Reader::attr_int(const std::string& object, const std::string& name) const {
  const std::vector<int64_t> v = attr_ints(object, name);
  require(v.size() == 1, path_ + ": attribute '" + name + "' of '" + object + "' is not one integer");
  return v[0];
}

double Hdf5Reader::attr_double(const std::string& object, const std::string& name) const {
  Handle attr{open_attr(object, name), H5Aclose};
  double value = 0;
  require(H5Aread(attr.id, H5T_NATIVE_DOUBLE, &value) >= 0, path_ + ": attribute '" + name + "' is not a number");
  return value;
}

std::string Hdf5Reader::attr_string(const std::string& object, const std::string& name) const {
  Handle attr{open_attr(object, name), H5Aclose};
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
  std::string value(H5Tget_size(type.id), '\0');
  require(H5Aread(attr.id, type.id, value.data()) >= 0, path_ + ": cannot read attribute '" + name + "'");
  return value.substr(0, value.find('\0'));
}

std::vector<std::string> Hdf5Reader::members(const std::string& group) const {
  std::vector<std::string> names;
  Handle g{H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose};
  require(g.id >= 0, path_ + ": missing group '" + group + "'");
  H5G_info_t info;
  H5Gget_info(g.id, &info);
  for (hsize_t i = 0; i < info.nlinks; i++) {
    const ssize_t length = H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(length, '\0');
    H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), length + 1, H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
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

Hdf5Writer::Hdf5Writer(const std::string& path) : path_(path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  require(file_ >= 0, "cannot create HDF5 file '" + path + "'");
}

Hdf5Writer::~Hdf5Writer() {
  if (file_ >= 0) H5Fclose(file_);
}

void Hdf5Writer::ensure_groups(const std::string& dataset) {
  for (size_t pos = dataset.find('/', 1); pos != std::string::npos; pos = dataset.find('/', pos + 1)) {
    const std::string group = dataset.substr(0, pos);
    if (H5Lexists(file_, group.c_str(), H5P_DEFAULT) > 0) continue;
    Handle g{H5Gcreate2(file_, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    require(g.id >= 0, path_ + ": cannot create group '" + group + "' (disk full?)");
  }
}

namespace {

void write_dataset(hid_t file, const std::string& path, const std::string& dataset, hid_t file_type, hid_t mem_type,
                   const void* data, const std::vector<int64_t>& shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
  Handle set{H5Dcreate2(file, dataset.c_str(), file_type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
  require(set.id >= 0, path + ": cannot create dataset '" + dataset + "' (disk full?)");
  require(H5Dwrite(set.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
          path + ": cannot write dataset '" + dataset + "' (disk full or file too large?)");
}

template <typename F>
void write_attr(hid_t file, const std::string& path, const std::string& object, const std::string& name, hid_t type,
                hid_t space, F write) {
  Handle attr{H5Acreate_by_name(file, object.c_str(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose};
  require(attr.id >= 0 && write(attr.id) >= 0, path + ": cannot write attribute '" + name + "'");
}

}  // namespace

void Hdf5Writer::write_floats(const std::string& dataset, const float* data, const std::vector<int64_t>& shape) {
  ensure_groups(dataset);
  write_dataset(file_, path_, dataset, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data, shape);
}

void Hdf5Writer::attr(const std::string& object, const std::string& name, int64_t value) {
  attr(object, name, std::vector<int64_t>{value});
}

void Hdf5Writer::attr(const std::string& object, const std::string& name, const std::vector<int64_t>& value) {
  const hsize_t n = value.size();
  Handle space{H5Screate_simple(1, &n, nullptr), H5Sclose};
  write_attr(file_, path_, object, name, H5T_STD_I64LE, space.id,
             [&](hid_t a) { return H5Awrite(a, H5T_NATIVE_INT64, value.data()); });
}

void Hdf5Writer::attr(const std::string& object, const std::string& name, double value) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  write_attr(file_, path_, object, name, H5T_IEEE_F64LE, space.id,
             [&](hid_t a) { return H5Awrite(a, H5T_NATIVE_DOUBLE, &value); });
}

void Hdf5Writer::attr(const std::string& object, const std::string& name, const std::string& value) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, std::max<size_t>(1, value.size()));
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  write_attr(file_, path_, object, name, type.id, space.id,
             [&](hid_t a) { return H5Awrite(a, type.id, value.c_str()); });
}

void Hdf5Writer::close() {
  const hid_t file = file_;
  file_ = -1;
  const bool flushed = H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0;
  const bool closed = H5Fclose(file) >= 0;
  require(flushed && closed, path_ + ": cannot finish writing (disk full or file too large?)");
}

}  // namespace trident
