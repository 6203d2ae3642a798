/// \file
/// The one place that includes the HDF5 C++ API, with the process-wide lock around every HDF5
/// call and the helpers shared by the HDF5 readers and writers.
#pragma once

// H5Cpp.h builds clean under -Wall -Wextra -Wpedantic with g++ 12 and clang 14; should a later
// HDF5 warn, this push/pop is the one place to silence it.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#endif
#include <H5Cpp.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <unistd.h>

#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::detail {

/// The lock every HDF5 call is made under. Debian's HDF5 is built without thread safety
/// guarantees for concurrent callers, so one process-wide mutex serialises all of them; it is
/// recursive so that helpers may call each other. A process forked while another thread holds it
/// would deadlock: fork before starting threads (as `SequenceAdapter` does).
inline std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

/// The innermost message of the last HDF5 error on this thread (`"file signature not found"`),
/// recorded by `record_hdf5_error` in place of HDF5's printing to stderr.
inline thread_local std::string hdf5_last_error;

inline herr_t record_hdf5_error(hid_t stack, void*) {
  std::string innermost;
  // Walking upward starts with the function that detected the error: its message says why.
  H5Ewalk2(
      stack, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* error, void* data) -> herr_t {
        if (n == 0 && error->desc != nullptr) *static_cast<std::string*>(data) = error->desc;
        return 0;
      },
      &innermost);
  hdf5_last_error = innermost;
  return 0;
}

/// Holds `hdf5_mutex()` and keeps HDF5 from printing errors: each failure becomes an
/// `H5::Exception`, converted into a `loadstar::Error` by the caller. (Error stacks are per
/// thread in a thread-safe HDF5 build, hence set for the calling thread every time.)
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) {
    H5::Exception::dontPrint();
    H5Eset_auto2(H5E_DEFAULT, &record_hdf5_error, nullptr);
    hdf5_last_error.clear();
  }

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

/// `"hdf5 file 'model.h5'"`: how messages name a file.
inline std::string hdf5_file_name(const std::filesystem::path& path) {
  return "hdf5 file '" + path.string() + "'";
}

/// An absolute dataset name: `"x"` becomes `"/x"`.
inline std::string absolute_dataset_name(std::string_view name) {
  return name.starts_with('/') ? std::string(name) : "/" + std::string(name);
}

/// Why an HDF5 call failed, for a message: HDF5's innermost reason when it gave one.
inline std::string hdf5_reason(const H5::Exception& error) {
  std::string reason = hdf5_last_error.empty() ? error.getDetailMsg() : hdf5_last_error;
  hdf5_last_error.clear();
  return reason;
}

/// Throws `IoError` when `path` is missing, a directory or unreadable by this process.
inline void check_readable(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw IoError(hdf5_file_name(path) + ": cannot open (is a directory)");
  }
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw IoError(hdf5_file_name(path) + ": cannot open (" +
                  (errno != 0 ? std::strerror(errno) : "unknown error") + ")");
  }
  std::fclose(file);
}

/// Opens an existing HDF5 file read-only (caller holds `Hdf5Lock`). Throws `IoError` when it
/// cannot be opened and `FormatError` when it is not an HDF5 file.
///
/// File locking is off: the readers never write, and a lock taken by `flock` belongs to the open
/// file description that a forked child shares, so a child closing its inherited handle would
/// release the parent's lock.
inline H5::H5File open_hdf5_for_reading(const std::filesystem::path& path) {
  check_readable(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw FormatError(hdf5_file_name(path) + ": expected an hdf5 file but found no hdf5 signature");
  }
  try {
    H5::FileAccPropList access;
    H5Pset_file_locking(access.getId(), false, true);
    return H5::H5File(path.c_str(), H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, access);
  } catch (const H5::Exception& error) {
    throw FormatError(hdf5_file_name(path) + ": cannot open (" + hdf5_reason(error) + ")");
  }
}

/// Whether the link `name` (absolute) exists, its parent groups included (`H5Lexists` fails
/// rather than answering false when a parent is missing).
inline bool hdf5_link_exists(const H5::H5File& file, const std::string& name) {
  try {
    for (std::size_t slash = name.find('/', 1);; slash = name.find('/', slash + 1)) {
      const std::string prefix = name.substr(0, slash);
      if (!prefix.empty() && prefix != "/" && !file.nameExists(prefix)) return false;
      if (slash == std::string::npos) return true;
    }
  } catch (const H5::Exception&) {
    hdf5_last_error.clear();
    return false;  // a parent that is a dataset, not a group
  }
}

/// Opens dataset `name` (absolute) of `file`; throws `FormatError` when it is missing or not a
/// dataset (caller holds `Hdf5Lock`).
inline H5::DataSet open_hdf5_dataset(const H5::H5File& file, const std::filesystem::path& path,
                                     const std::string& name) {
  if (name == "/" || !hdf5_link_exists(file, name)) {
    throw FormatError(hdf5_file_name(path) + ": dataset '" + name + "' missing");
  }
  try {
    if (file.childObjType(name) != H5O_TYPE_DATASET) {
      throw FormatError(hdf5_file_name(path) + ": expected '" + name +
                        "' to be a dataset but it is a group");
    }
    return file.openDataSet(name);
  } catch (const H5::Exception& error) {
    throw FormatError(hdf5_file_name(path) + ": cannot open dataset '" + name + "' (" +
                      hdf5_reason(error) + ")");
  }
}

/// The stored element type as NumPy names it (`"float64"`, `"uint8"`), or its HDF5 class
/// (`"string"`, `"compound"`) when it is neither an integer nor a float.
inline std::string hdf5_type_name(const H5::DataSet& dataset) {
  switch (dataset.getTypeClass()) {
    case H5T_INTEGER: {
      const H5::IntType type = dataset.getIntType();
      return (type.getSign() == H5T_SGN_NONE ? "uint" : "int") + std::to_string(8 * type.getSize());
    }
    case H5T_FLOAT:
      return "float" + std::to_string(8 * dataset.getFloatType().getSize());
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_TIME:
      return "time";
    default:
      return "unknown";
  }
}

/// The HDF5 memory type of `T`.
template <TensorElement T>
const H5::PredType& hdf5_native_type() {
  if constexpr (std::same_as<T, float>) {
    return H5::PredType::NATIVE_FLOAT;
  } else if constexpr (std::same_as<T, double>) {
    return H5::PredType::NATIVE_DOUBLE;
  } else if constexpr (std::same_as<T, std::int32_t>) {
    return H5::PredType::NATIVE_INT32;
  } else if constexpr (std::same_as<T, std::int64_t>) {
    return H5::PredType::NATIVE_INT64;
  } else {
    return H5::PredType::NATIVE_UINT8;
  }
}

/// The little-endian HDF5 file type `T` is stored as (what NumPy and h5py write on x86).
template <TensorElement T>
const H5::PredType& hdf5_file_type() {
  if constexpr (std::same_as<T, float>) {
    return H5::PredType::IEEE_F32LE;
  } else if constexpr (std::same_as<T, double>) {
    return H5::PredType::IEEE_F64LE;
  } else if constexpr (std::same_as<T, std::int32_t>) {
    return H5::PredType::STD_I32LE;
  } else if constexpr (std::same_as<T, std::int64_t>) {
    return H5::PredType::STD_I64LE;
  } else {
    return H5::PredType::STD_U8LE;
  }
}

/// Throws `ShapeError` unless the dataset's type class is `T`'s (integer or float): HDF5
/// converts sizes and signedness within a class, never across classes.
template <TensorElement T>
void check_hdf5_type_class(const H5::DataSet& dataset, const std::filesystem::path& path,
                           const std::string& name) {
  constexpr H5T_class_t wanted = std::is_floating_point_v<T> ? H5T_FLOAT : H5T_INTEGER;
  if (dataset.getTypeClass() != wanted) {
    throw ShapeError(
        hdf5_file_name(path) + ": dataset '" + name + "' holds " + hdf5_type_name(dataset) +
        " values but " + std::string(dtype_name<T>()) + " was requested (" +
        (wanted == H5T_FLOAT ? "a floating-point" : "an integer") + " type is needed)");
  }
}

/// The shape of a dataset (rank 0 for a scalar dataspace); throws `FormatError` for a null
/// dataspace and `ShapeError` beyond `Shape::max_rank` dimensions.
inline Shape hdf5_dataset_shape(const H5::DataSet& dataset, const std::filesystem::path& path,
                                const std::string& name) {
  const H5::DataSpace space = dataset.getSpace();
  const H5S_class_t kind = space.getSimpleExtentType();
  if (kind == H5S_SCALAR) return Shape{};
  if (kind != H5S_SIMPLE) {
    throw FormatError(hdf5_file_name(path) + ": dataset '" + name +
                      "' has a null dataspace and holds no array");
  }
  const int rank = space.getSimpleExtentNdims();
  if (rank < 0 || static_cast<std::size_t>(rank) > Shape::max_rank) {
    throw ShapeError(hdf5_file_name(path) + ": dataset '" + name + "' has rank " +
                     std::to_string(rank) + " but at most " + std::to_string(Shape::max_rank) +
                     " dimensions are supported");
  }
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  space.getSimpleExtentDims(dims.data());
  return Shape(dims);
}

}  // namespace loadstar::detail
