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

#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "loadstar/data/hdf5_options.hpp"
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

/// The innermost message of this thread's current HDF5 error stack (`"file signature not
/// found"`), or empty. Read when a failure is caught, before any other HDF5 call clears the stack.
inline std::string hdf5_innermost_error() {
  std::string innermost;
  // Walking upward starts with the function that detected the error: its message says why.
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* error, void* data) -> herr_t {
        if (n == 0 && error->desc != nullptr) *static_cast<std::string*>(data) = error->desc;
        return 0;
      },
      &innermost);
  return innermost;
}

/// Holds `hdf5_mutex()` and keeps HDF5 from printing errors: each failure becomes an
/// `H5::Exception`, converted into a `loadstar::Error` by the caller. (Error stacks are per
/// thread in a thread-safe HDF5 build, hence set for the calling thread every time.)
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) { configure_errors(); }

  /// What the constructor does besides locking, for a sandbox child, which runs HDF5 alone and
  /// must not take the lock its parent held when it forked.
  ///
  /// No automatic error handler is installed, not even one that only records the message: with
  /// one, libhdf5 1.10 leaves state behind when opening a corrupt dataset fails, and the process
  /// prints "HDF5: infinite loop closing library" at exit. The message is read from the error
  /// stack when the failure is caught (`hdf5_reason`).
  static void configure_errors() {
    H5::Exception::dontPrint();
    H5Eclear2(H5E_DEFAULT);
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
  std::string reason = hdf5_innermost_error();
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? error.getDetailMsg() : reason;
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
  // Outside the `try`: its destructor, an HDF5 call, would clear the error stack before the
  // handler reads it.
  H5::FileAccPropList access;
  H5Pset_file_locking(access.getId(), false, true);
  try {
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
    H5Eclear2(H5E_DEFAULT);
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

/// The 16-bit float types h5py writes: IEEE half precision (`numpy.float16`: sign bit 15,
/// exponent bits 10-14 with bias 15, mantissa bits 0-9), and for `bfloat16`, which h5py has no
/// type for, `float`'s upper half (exponent bits 7-14 with bias 127, mantissa bits 0-6).
inline H5::FloatType hdf5_16_bit_float(bool brain) {
  H5::FloatType type(H5::PredType::IEEE_F32LE);
  if (brain) {
    type.setFields(15, 7, 8, 0, 7);
    type.setSize(2);
    type.setEbias(127);
  } else {
    type.setFields(15, 10, 5, 0, 10);
    type.setSize(2);
    type.setEbias(15);
  }
  return type;
}

/// The HDF5 memory type of `T`.
template <TensorElement T>
H5::DataType hdf5_native_type() {
  if constexpr (std::same_as<T, float>) {
    return H5::PredType::NATIVE_FLOAT;
  } else if constexpr (std::same_as<T, double>) {
    return H5::PredType::NATIVE_DOUBLE;
  } else if constexpr (std::same_as<T, std::int32_t>) {
    return H5::PredType::NATIVE_INT32;
  } else if constexpr (std::same_as<T, std::int64_t>) {
    return H5::PredType::NATIVE_INT64;
  } else if constexpr (std::same_as<T, float16> || std::same_as<T, bfloat16>) {
    static_assert(std::endian::native == std::endian::little,
                  "the 16-bit float types are laid out little-endian");
    return hdf5_16_bit_float(std::same_as<T, bfloat16>);
  } else {
    return H5::PredType::NATIVE_UINT8;
  }
}

/// The little-endian HDF5 file type `T` is stored as (what NumPy and h5py write on x86).
template <TensorElement T>
H5::DataType hdf5_file_type() {
  if constexpr (std::same_as<T, float>) {
    return H5::PredType::IEEE_F32LE;
  } else if constexpr (std::same_as<T, double>) {
    return H5::PredType::IEEE_F64LE;
  } else if constexpr (std::same_as<T, std::int32_t>) {
    return H5::PredType::STD_I32LE;
  } else if constexpr (std::same_as<T, std::int64_t>) {
    return H5::PredType::STD_I64LE;
  } else if constexpr (std::same_as<T, float16> || std::same_as<T, bfloat16>) {
    return hdf5_16_bit_float(std::same_as<T, bfloat16>);
  } else {
    return H5::PredType::STD_U8LE;
  }
}

/// Throws `ShapeError` unless the dataset's type class is `T`'s (integer or float): HDF5
/// converts sizes and signedness within a class, never across classes.
template <TensorElement T>
void check_hdf5_type_class(const H5::DataSet& dataset, const std::filesystem::path& path,
                           const std::string& name) {
  constexpr H5T_class_t wanted = FloatingElement<T> ? H5T_FLOAT : H5T_INTEGER;
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
  // Dimensions come from the file: their product must not wrap before a `Shape` is made of them.
  if (!Shape::checked_product(dims)) {
    std::string text = "(";
    for (std::size_t i = 0; i < dims.size(); ++i)
      text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
    throw FormatError(hdf5_file_name(path) + ": dataset '" + name + "' declares shape " + text +
                      "), more elements than memory can address");
  }
  return Shape(dims);
}

/// `"1024 bytes"`: an exact byte count for messages.
inline std::string hdf5_bytes_text(std::uint64_t bytes) {
  return std::to_string(bytes) + " bytes";
}

/// The bytes of `elements` elements of `element_bytes` each, saturated at the largest value
/// (for comparisons with limits, where a saturated value is as refused as the exact one).
inline std::uint64_t saturating_bytes(std::uint64_t elements, std::uint64_t element_bytes) {
  std::uint64_t bytes = 0;
  return __builtin_mul_overflow(elements, element_bytes, &bytes)
             ? std::numeric_limits<std::uint64_t>::max()
             : bytes;
}

/// Throws `FormatError` unless the data dataset `name` (of shape `shape`, read as
/// `memory_element_bytes`-byte elements) declares is what the file stores, checked before
/// anything is allocated or read:
/// - compact data must hold every element (libhdf5 1.10 reads past a shorter buffer);
/// - contiguous data must fit in the file;
/// - at most `options.max_fill_bytes` may come from the fill value, for chunks never written
///   or storage never allocated (HDF5 writes the fill value without reading anything, so a file
///   of 1,672 bytes can declare a gigabyte);
/// - a chunk may hold at most `options.max_bytes` (HDF5 allocates whole chunks);
/// - an untrusted file may not name external files or virtual sources, which would read other
///   files of this machine.
inline void check_hdf5_storage(const H5::DataSet& dataset, const std::filesystem::path& path,
                               const std::string& name, const Shape& shape,
                               std::size_t memory_element_bytes, const Hdf5Options& options) {
  const std::string where = hdf5_file_name(path) + ": dataset '" + name + "'";
  const hid_t id = dataset.getId();
  const std::uint64_t elements = shape.elements();
  const std::uint64_t file_bytes = saturating_bytes(elements, dataset.getDataType().getSize());
  const std::uint64_t memory_bytes = saturating_bytes(elements, memory_element_bytes);
  const H5::DSetCreatPropList create = dataset.getCreatePlist();
  const H5D_layout_t layout = create.getLayout();
  if (layout == H5D_VIRTUAL || create.getExternalCount() > 0) {
    if (options.trust == Trust::untrusted) {
      throw FormatError(
          where + " is stored in " +
          (layout == H5D_VIRTUAL ? "other datasets (a virtual layout)" : "external files") +
          ", which an untrusted file may not name");
    }
    return;
  }
  // Elements no stored data backs: HDF5 gives them the fill value.
  std::uint64_t unwritten = 0;
  std::string stored;
  if (layout == H5D_COMPACT) {
    const std::uint64_t held = H5Dget_storage_size(id);
    if (held < file_bytes) {
      throw FormatError(where + " has shape " + shape.str() + " of " +
                        std::to_string(dataset.getDataType().getSize()) + "-byte elements (" +
                        hdf5_bytes_text(file_bytes) + ") but its compact storage holds " +
                        hdf5_bytes_text(held));
    }
  } else if (layout == H5D_CONTIGUOUS) {
    const std::uint64_t held = H5Dget_storage_size(id);
    if (held == 0) {
      unwritten = elements;
      stored = "no data (its storage was never allocated)";
    } else {
      std::error_code error;
      const std::uint64_t size = std::filesystem::file_size(path, error);
      if (!error && file_bytes > size) {
        throw FormatError(where + " has shape " + shape.str() + " (" + hdf5_bytes_text(file_bytes) +
                          " stored contiguously) but the file has " + hdf5_bytes_text(size));
      }
    }
  } else if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(shape.rank());
    if (shape.rank() > 0) create.getChunk(static_cast<int>(chunk.size()), chunk.data());
    const auto chunk_elements = Shape::checked_product(chunk);
    const std::uint64_t chunk_bytes =
        chunk_elements ? saturating_bytes(*chunk_elements, dataset.getDataType().getSize())
                       : std::numeric_limits<std::uint64_t>::max();
    if (chunk_bytes > options.max_bytes) {
      throw FormatError(where + " is stored in chunks of " + hdf5_bytes_text(chunk_bytes) +
                        ", more than the limit of " + hdf5_bytes_text(options.max_bytes) +
                        " (Hdf5Options::max_bytes)");
    }
    hsize_t chunks = 0;
    const H5::DataSpace space = dataset.getSpace();
    if (H5Dget_num_chunks(id, space.getId(), &chunks) < 0) {
      throw H5::DataSetIException("H5Dget_num_chunks", "cannot count the stored chunks");
    }
    const std::uint64_t covered = saturating_bytes(chunks, chunk_elements.value_or(0));
    unwritten = elements > covered ? elements - covered : 0;
    stored = std::to_string(chunks) + " chunks of " + std::to_string(chunk_elements.value_or(0)) +
             " elements";
  }
  const std::uint64_t fill_bytes = saturating_bytes(unwritten, memory_element_bytes);
  if (fill_bytes > options.max_fill_bytes) {
    throw FormatError(where + " has shape " + shape.str() + " (" + hdf5_bytes_text(memory_bytes) +
                      " to read) but the file stores " + stored + ": " +
                      hdf5_bytes_text(fill_bytes) +
                      " would be fill value never written, more than the limit of " +
                      hdf5_bytes_text(options.max_fill_bytes) + " (Hdf5Options::max_fill_bytes)");
  }
}

/// The bytes of a read of `shape` as `element_bytes`-byte elements, which a read allocates;
/// throws `FormatError` naming `what` when they exceed `options.max_bytes`.
inline std::size_t checked_hdf5_read_bytes(const std::string& what, const Shape& shape,
                                           std::size_t element_bytes, const Hdf5Options& options) {
  const std::uint64_t bytes = saturating_bytes(shape.elements(), element_bytes);
  if (bytes > options.max_bytes) {
    throw FormatError(what + " of shape " + shape.str() + " needs " + hdf5_bytes_text(bytes) +
                      ", more than the limit of " + hdf5_bytes_text(options.max_bytes) +
                      " (Hdf5Options::max_bytes)");
  }
  return static_cast<std::size_t>(bytes);
}

}  // namespace loadstar::detail
