/// \file
/// The HDF5 calls of the Keras file formats, on HDF5's C API (the string attribute kinds Keras
/// writes, fixed and variable length, and datasets at slash-separated paths need it): RAII
/// handles, a writer that reproduces h5py's types, and a reader that checks what a file declares
/// before allocating. The caller holds `hdf5_mutex()` (or is a sandbox child).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras::detail {

/// An HDF5 identifier closed by the matching `H5*close` when it goes out of scope.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(H5Id&& other) noexcept : id_(std::exchange(other.id_, -1)), closer_(other.closer_) {}
  LOADSTAR_DECL H5Id& operator=(H5Id&& other) noexcept;
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  LOADSTAR_DECL void reset() noexcept;
  /// Closes now and reports whether HDF5 succeeded (a file's close flushes it).
  LOADSTAR_DECL bool close() noexcept;

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

/// Why the last HDF5 call failed, for a message (clears the error stack).
LOADSTAR_DECL std::string h5_last_error();

// --- writing ------------------------------------------------------------------------------------

/// Writes Keras's HDF5 objects into one open file; every failure is an `IoError` naming the file
/// and the object.
class H5Writer {
 public:
  /// A new file at `path` (truncated), with HDF5's default (earliest) format as h5py writes it:
  /// superblock version 0, old-style groups, so that HDF5 1.8 readers open it too.
  /// `shown` is the path messages name (the final name of a file written to a temporary one).
  LOADSTAR_DECL H5Writer(const std::filesystem::path& path, const std::filesystem::path& shown);

  /// A file in memory (HDF5's core driver without a backing store), for the `model.weights.h5`
  /// of a `.keras` archive; `image()` returns its bytes.
  LOADSTAR_DECL explicit H5Writer(std::string where);

  hid_t root() const noexcept { return file_.get(); }

  /// The bytes of an in-memory file.
  LOADSTAR_DECL std::string image();

  /// Flushes and closes the file.
  void close() {
    if (!file_.close()) fail("cannot close (flush) the file");
  }

  /// Creates group `name` under `parent` (intermediate groups included).
  LOADSTAR_DECL H5Id create_group(hid_t parent, const std::string& name);

  /// A scalar variable-length string attribute, as h5py stores a Python `str` (UTF-8) or
  /// `bytes` (ASCII).
  LOADSTAR_DECL void string_attribute(hid_t object, const std::string& name,
                                      const std::string& value, bool utf8);

  /// A list of names as h5py 3 stores a list of `bytes` (what Keras writes for `layer_names` and
  /// `weight_names`): a 1-D variable-length ASCII array; an empty list is h5py's empty array of
  /// float64, shape (0,).
  LOADSTAR_DECL void string_list_attribute(hid_t object, const std::string& name,
                                           const std::vector<std::string>& values);

  /// A float32 dataset at the slash-separated path `name` under `parent` (intermediate groups
  /// created, as h5py does for Keras's weight names): contiguous, uncompressed, little-endian.
  LOADSTAR_DECL void float_dataset(hid_t parent, const std::string& name, const Shape& shape,
                                   const float* values);

  /// A scalar int64 dataset (an optimizer's iteration count).
  LOADSTAR_DECL void int64_dataset(hid_t parent, const std::string& name, std::int64_t value);

  [[noreturn]] LOADSTAR_DECL void fail(const std::string& what) const;

 private:
  LOADSTAR_DECL static H5Id vlen_string_type(bool utf8);

  LOADSTAR_DECL hid_t link_list();

  std::string where_;
  H5Id file_;
  H5Id links_;
};

// --- reading ------------------------------------------------------------------------------------

/// One array read from a file: float values, or (for an integer dataset) `integer` with the
/// value of a scalar.
struct StoredArray {
  std::string name;
  Shape shape;
  std::vector<float> values;
  std::optional<std::int64_t> integer;
};

/// Reads Keras's HDF5 objects from one open file; every problem is a `FormatError` naming the
/// file (`where`) and the object. Sizes are checked before anything is allocated: a dataset may
/// not declare more bytes than `max_bytes`, nor more than the container could hold
/// uncompressed-or-compressed 64-fold.
class H5Reader {
 public:
  /// Opens `path` read-only (file locking off: see `open_hdf5_for_reading`).
  LOADSTAR_DECL explicit H5Reader(const std::filesystem::path& path);

  /// Opens an HDF5 file image held in memory (`model.weights.h5` of a `.keras` archive).
  LOADSTAR_DECL H5Reader(const std::string& image, std::string where);

  static std::string hdf5_name(const std::filesystem::path& path) {
    return "hdf5 file '" + path.string() + "'";
  }

  const std::string& where() const noexcept { return where_; }
  hid_t root() const noexcept { return file_.get(); }

  /// The most bytes one dataset may declare.
  std::uint64_t max_bytes = std::uint64_t{1} << 34;

  [[noreturn]] LOADSTAR_DECL void fail(const std::string& what) const;

  /// Whether `path` (relative to `location`, slashes allowed) names an object, each parent
  /// checked first (`H5Lexists` fails rather than answering false when a parent is missing).
  LOADSTAR_DECL bool exists(hid_t location, const std::string& path) const;

  /// Whether `path` under `location` is a group.
  LOADSTAR_DECL bool is_group(hid_t location, const std::string& path) const;

  /// Opens group `path` under `location`; `what` names it in messages.
  LOADSTAR_DECL H5Id open_group(hid_t location, const std::string& path,
                                const std::string& what) const;

  /// The names of the links in a group, in name order.
  LOADSTAR_DECL std::vector<std::string> children(hid_t group, const std::string& what) const;

  LOADSTAR_DECL bool has_attribute(hid_t object, const std::string& name) const;

  /// A string attribute, scalar (or an array of one), fixed or variable length.
  LOADSTAR_DECL std::string string_attribute(hid_t object, const std::string& name,
                                             const std::string& what) const;

  /// A list of names (`layer_names`, `weight_names`): fixed-length NULLPAD strings (h5py 2), or
  /// variable-length ones (h5py 3), or h5py's empty float64 array for an empty list; Keras splits a
  /// list too large for one attribute into `name0`, `name1`, ...
  LOADSTAR_DECL std::vector<std::string> string_list_attribute(hid_t object,
                                                               const std::string& name,
                                                               const std::string& what) const;

  /// The dataset at `path` under `location`: float data as float32, integers (an iteration
  /// count) as a scalar int64 or converted to float.
  LOADSTAR_DECL StoredArray dataset(hid_t location, const std::string& path,
                                    const std::string& what) const;

 private:
  /// Refuses data a file declares but cannot hold: external or virtual storage, contiguous data
  /// past the end of the container or never written, compact data shorter than declared, and
  /// chunked data whose size exceeds what the container could hold 64-fold compressed.
  LOADSTAR_DECL void check_storage(hid_t dataset, const std::string& object, const Shape& shape,
                                   std::uint64_t file_bytes) const;

  /// The strings of an attribute (fixed or variable length, scalar or 1-D), an empty list for
  /// h5py's empty float array, or nothing for any other type.
  LOADSTAR_DECL std::optional<std::vector<std::string>> strings(hid_t object,
                                                                const std::string& name,
                                                                const std::string& what) const;

  std::string where_;
  std::uint64_t container_bytes_ = 0;
  H5Id file_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

H5Id& H5Id::operator=(H5Id&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = std::exchange(other.id_, -1);
    closer_ = other.closer_;
  }
  return *this;
}

void H5Id::reset() noexcept {
  if (id_ >= 0 && closer_ != nullptr) closer_(id_);
  id_ = -1;
}

bool H5Id::close() noexcept {
  const bool ok = id_ < 0 || closer_ == nullptr || closer_(id_) >= 0;
  id_ = -1;
  return ok;
}

H5Writer::H5Writer(const std::filesystem::path& path, const std::filesystem::path& shown)
    : where_("hdf5 file '" + shown.string() + "'") {
  H5Id access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_file_locking(access.get(), false, true);
  file_ = H5Id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), H5Fclose);
  if (!file_.valid()) fail("cannot create the file");
}

H5Writer::H5Writer(std::string where) : where_(std::move(where)) {
  H5Id access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(access.get(), 1 << 16, false);
  file_ = H5Id(H5Fcreate("model.weights.h5", H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), H5Fclose);
  if (!file_.valid()) fail("cannot create the file in memory");
}

std::string H5Writer::image() {
  if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) fail("cannot flush");
  const ssize_t size = H5Fget_file_image(file_.get(), nullptr, 0);
  if (size < 0) fail("cannot get the file image");
  std::string bytes(static_cast<std::size_t>(size), '\0');
  if (H5Fget_file_image(file_.get(), bytes.data(), bytes.size()) != size) {
    fail("cannot get the file image");
  }
  return bytes;
}

H5Id H5Writer::create_group(hid_t parent, const std::string& name) {
  H5Id group(H5Gcreate2(parent, name.c_str(), link_list(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) fail("cannot create group '" + name + "'");
  return group;
}

void H5Writer::string_attribute(hid_t object, const std::string& name, const std::string& value,
                                bool utf8) {
  H5Id type = vlen_string_type(utf8);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attribute(
      H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  if (!attribute.valid()) fail("cannot create attribute '" + name + "'");
  const char* pointer = value.c_str();
  if (H5Awrite(attribute.get(), type.get(), &pointer) < 0) {
    fail("cannot write attribute '" + name + "'");
  }
}

void H5Writer::string_list_attribute(hid_t object, const std::string& name,
                                     const std::vector<std::string>& values) {
  const hsize_t count = values.size();
  H5Id space(H5Screate_simple(1, &count, nullptr), H5Sclose);
  H5Id type = values.empty() ? H5Id(H5Tcopy(H5T_IEEE_F64LE), H5Tclose) : vlen_string_type(false);
  H5Id attribute(
      H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  if (!attribute.valid()) fail("cannot create attribute '" + name + "'");
  if (values.empty()) return;
  std::vector<const char*> pointers;
  for (const auto& value : values)
    pointers.push_back(value.c_str());
  if (H5Awrite(attribute.get(), type.get(), pointers.data()) < 0) {
    fail("cannot write attribute '" + name + "'");
  }
}

void H5Writer::float_dataset(hid_t parent, const std::string& name, const Shape& shape,
                             const float* values) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Id space(shape.rank() == 0
                 ? H5Screate(H5S_SCALAR)
                 : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
             H5Sclose);
  H5Id dataset(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space.get(), link_list(),
                          H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose);
  if (!dataset.valid()) fail("cannot create dataset '" + name + "'");
  if (shape.elements() > 0 &&
      H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
    fail("cannot write dataset '" + name + "'");
  }
}

void H5Writer::int64_dataset(hid_t parent, const std::string& name, std::int64_t value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id dataset(H5Dcreate2(parent, name.c_str(), H5T_STD_I64LE, space.get(), link_list(),
                          H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose);
  if (!dataset.valid()) fail("cannot create dataset '" + name + "'");
  if (H5Dwrite(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value) < 0) {
    fail("cannot write dataset '" + name + "'");
  }
}

void H5Writer::fail(const std::string& what) const {
  throw IoError(where_ + ": " + what + " (" + h5_last_error() + ")");
}

H5Id H5Writer::vlen_string_type(bool utf8) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
  return type;
}

hid_t H5Writer::link_list() {
  if (!links_.valid()) {
    links_ = H5Id(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(links_.get(), 1);
  }
  return links_.get();
}

H5Reader::H5Reader(const std::filesystem::path& path) : where_(hdf5_name(path)) {
  loadstar::detail::check_readable(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw FormatError(where_ + ": expected an hdf5 file but found no hdf5 signature");
  }
  std::error_code error;
  container_bytes_ = std::filesystem::file_size(path, error);
  H5Id access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_file_locking(access.get(), false, true);
  file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file_.valid()) throw FormatError(where_ + ": cannot open (" + h5_last_error() + ")");
}

H5Reader::H5Reader(const std::string& image, std::string where) : where_(std::move(where)) {
  container_bytes_ = image.size();
  if (image.size() < 8 || std::memcmp(image.data(), "\x89HDF\r\n\x1a\n", 8) != 0) {
    throw FormatError(where_ + ": expected an hdf5 file but found no hdf5 signature");
  }
  H5Id access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(access.get(), 1 << 16, false);
  if (H5Pset_file_image(access.get(), const_cast<char*>(image.data()), image.size()) < 0) {
    throw FormatError(where_ + ": cannot open (" + h5_last_error() + ")");
  }
  file_ = H5Id(H5Fopen("model.weights.h5", H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file_.valid()) throw FormatError(where_ + ": cannot open (" + h5_last_error() + ")");
}

void H5Reader::fail(const std::string& what) const {
  throw FormatError(where_ + ": " + what);
}

bool H5Reader::exists(hid_t location, const std::string& path) const {
  if (path.empty()) return false;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = path.find('/', start);
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && prefix != "/") {
      const htri_t found = H5Lexists(location, prefix.c_str(), H5P_DEFAULT);
      if (found <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
      if (slash != std::string::npos) {
        H5O_info_t info;
        if (H5Oget_info_by_name(location, prefix.c_str(), &info, H5P_DEFAULT) < 0 ||
            info.type != H5O_TYPE_GROUP) {
          H5Eclear2(H5E_DEFAULT);
          return false;
        }
      }
    }
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool H5Reader::is_group(hid_t location, const std::string& path) const {
  if (!exists(location, path)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(location, path.c_str(), &info, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return info.type == H5O_TYPE_GROUP;
}

H5Id H5Reader::open_group(hid_t location, const std::string& path, const std::string& what) const {
  if (!is_group(location, path)) fail(what + ": group '" + path + "' missing");
  H5Id group(H5Gopen2(location, path.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.valid()) fail(what + ": cannot open group '" + path + "' (" + h5_last_error() + ")");
  return group;
}

std::vector<std::string> H5Reader::children(hid_t group, const std::string& what) const {
  std::vector<std::string> names;
  hsize_t index = 0;
  const herr_t status = H5Literate(
      group, H5_INDEX_NAME, H5_ITER_INC, &index,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        auto& list = *static_cast<std::vector<std::string>*>(data);
        if (list.size() > 1000000) return -1;
        list.emplace_back(name);
        return 0;
      },
      &names);
  if (status < 0) fail(what + ": cannot list the group (" + h5_last_error() + ")");
  return names;
}

bool H5Reader::has_attribute(hid_t object, const std::string& name) const {
  const htri_t found = H5Aexists(object, name.c_str());
  if (found < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return found > 0;
}

std::string H5Reader::string_attribute(hid_t object, const std::string& name,
                                       const std::string& what) const {
  auto values = strings(object, name, what);
  if (!values || values->size() != 1) {
    fail(what + ": attribute '" + name + "' is not one string");
  }
  return std::move(values->front());
}

std::vector<std::string> H5Reader::string_list_attribute(hid_t object, const std::string& name,
                                                         const std::string& what) const {
  if (has_attribute(object, name)) {
    auto values = strings(object, name, what);
    if (!values) fail(what + ": attribute '" + name + "' holds neither strings nor an empty list");
    return std::move(*values);
  }
  std::vector<std::string> all;
  for (std::size_t chunk = 0;; ++chunk) {
    const std::string part = name + std::to_string(chunk);
    if (!has_attribute(object, part)) {
      if (chunk == 0) fail(what + ": attribute '" + name + "' missing");
      return all;
    }
    auto values = strings(object, part, what);
    if (!values) fail(what + ": attribute '" + part + "' does not hold strings");
    all.insert(all.end(), values->begin(), values->end());
  }
}

StoredArray H5Reader::dataset(hid_t location, const std::string& path,
                              const std::string& what) const {
  const std::string object = what + ": dataset '" + path + "'";
  if (!exists(location, path)) fail(object + " missing");
  H5O_info_t info;
  if (H5Oget_info_by_name(location, path.c_str(), &info, H5P_DEFAULT) < 0 ||
      info.type != H5O_TYPE_DATASET) {
    H5Eclear2(H5E_DEFAULT);
    fail(object + " is not a dataset");
  }
  H5Id dataset(H5Dopen2(location, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) fail("cannot open " + object + " (" + h5_last_error() + ")");
  H5Id type(H5Dget_type(dataset.get()), H5Tclose);
  const H5T_class_t kind = H5Tget_class(type.get());
  if (kind != H5T_FLOAT && kind != H5T_INTEGER) {
    fail(object + " holds neither floats nor integers");
  }
  H5Id space(H5Dget_space(dataset.get()), H5Sclose);
  const H5S_class_t space_kind = H5Sget_simple_extent_type(space.get());
  StoredArray out;
  out.name = path;
  if (space_kind == H5S_SIMPLE) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || static_cast<std::size_t>(rank) > Shape::max_rank) {
      fail(object + " has rank " + std::to_string(rank) + ", more than " +
           std::to_string(Shape::max_rank));
    }
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (!Shape::checked_product(dims)) fail(object + " declares more elements than fit in memory");
    out.shape = Shape(dims);
  } else if (space_kind != H5S_SCALAR) {
    fail(object + " has a null dataspace");
  }
  const std::uint64_t elements = out.shape.elements();
  const std::uint64_t bytes = loadstar::detail::saturating_bytes(elements, 4);
  if (bytes > max_bytes) {
    fail(object + " of shape " + out.shape.str() + " needs " + std::to_string(bytes) +
         " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  check_storage(dataset.get(), object, out.shape,
                loadstar::detail::saturating_bytes(elements, H5Tget_size(type.get())));
  if (kind == H5T_INTEGER && out.shape.rank() == 0) {
    std::int64_t value = 0;
    if (H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value) < 0) {
      fail("cannot read " + object + " (" + h5_last_error() + ")");
    }
    out.integer = value;
    out.values.assign(1, static_cast<float>(value));
    return out;
  }
  out.values.resize(elements);
  if (elements > 0 && H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                              out.values.data()) < 0) {
    fail("cannot read " + object + " (" + h5_last_error() + ")");
  }
  return out;
}

void H5Reader::check_storage(hid_t dataset, const std::string& object, const Shape& shape,
                             std::uint64_t file_bytes) const {
  H5Id create(H5Dget_create_plist(dataset), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(create.get());
  if (layout == H5D_VIRTUAL || H5Pget_external_count(create.get()) > 0) {
    fail(object + " is stored in other files or datasets, which a Keras file may not name");
  }
  const std::uint64_t held = H5Dget_storage_size(dataset);
  if (layout == H5D_COMPACT || layout == H5D_CONTIGUOUS) {
    if (file_bytes > 0 && held < file_bytes) {
      fail(object + " has shape " + shape.str() + " (" + std::to_string(file_bytes) +
           " bytes) but the file stores " + std::to_string(held) + " bytes of it");
    }
    if (layout == H5D_CONTIGUOUS && file_bytes > container_bytes_) {
      fail(object + " has shape " + shape.str() + " (" + std::to_string(file_bytes) +
           " bytes) but the file has " + std::to_string(container_bytes_) + " bytes");
    }
  } else if (layout == H5D_CHUNKED) {
    const std::uint64_t bound =
        std::max<std::uint64_t>(std::uint64_t{1} << 26, 64 * container_bytes_);
    if (file_bytes > bound) {
      fail(object + " has shape " + shape.str() + " (" + std::to_string(file_bytes) +
           " bytes) but the file has " + std::to_string(container_bytes_) + " bytes");
    }
  } else {
    fail(object + " has an unknown storage layout");
  }
}

std::optional<std::vector<std::string>> H5Reader::strings(hid_t object, const std::string& name,
                                                          const std::string& what) const {
  H5Id attribute(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attribute.valid()) fail(what + ": cannot open attribute '" + name + "'");
  H5Id type(H5Aget_type(attribute.get()), H5Tclose);
  H5Id space(H5Aget_space(attribute.get()), H5Sclose);
  const H5S_class_t space_kind = H5Sget_simple_extent_type(space.get());
  hssize_t count = 1;
  if (space_kind == H5S_SIMPLE) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank != 1) fail(what + ": attribute '" + name + "' is not a list");
    count = H5Sget_simple_extent_npoints(space.get());
  } else if (space_kind != H5S_SCALAR) {
    return std::vector<std::string>{};
  }
  if (count < 0 || count > (1 << 24)) fail(what + ": attribute '" + name + "' is too large");
  const H5T_class_t kind = H5Tget_class(type.get());
  if (kind != H5T_STRING) {
    if (count == 0) return std::vector<std::string>{};
    return std::nullopt;
  }
  std::vector<std::string> out;
  const auto n = static_cast<std::size_t>(count);
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.get(), H5T_VARIABLE);
    H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
    std::vector<char*> pointers(n, nullptr);
    if (n > 0 && H5Aread(attribute.get(), memory.get(), pointers.data()) < 0) {
      fail(what + ": cannot read attribute '" + name + "' (" + h5_last_error() + ")");
    }
    for (char* p : pointers)
      out.emplace_back(p != nullptr ? p : "");
    if (n > 0) H5Dvlen_reclaim(memory.get(), space.get(), H5P_DEFAULT, pointers.data());
    return out;
  }
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (std::size_t{1} << 20) ||
      n > (std::size_t{1} << 28) / std::max<std::size_t>(size, 1)) {
    fail(what + ": attribute '" + name + "' is too large");
  }
  std::string buffer(n * size, '\0');
  if (n > 0 && H5Aread(attribute.get(), type.get(), buffer.data()) < 0) {
    fail(what + ": cannot read attribute '" + name + "' (" + h5_last_error() + ")");
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::string value = buffer.substr(i * size, size);
    value.resize(std::strlen(value.c_str()));
    out.push_back(std::move(value));
  }
  return out;
}

std::string h5_last_error() {
  std::string reason = loadstar::detail::hdf5_innermost_error();
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("unknown hdf5 error") : reason;
}

}  // namespace loadstar::keras::detail
#endif
