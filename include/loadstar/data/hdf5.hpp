/// \file
/// `read_hdf5` and `write_hdf5`: one named HDF5 dataset to and from a `Tensor`.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <system_error>

#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/data/detail/sandbox.hpp"
#include "loadstar/data/hdf5_options.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

namespace detail {

/// Opens `file`, checks dataset `name` (type class, rank, sizes, storage) and reads it into the
/// memory `allocate(shape, bytes)` returns. In this process for `Trust::trusted` (the caller
/// holds `Hdf5Lock`), in a sandbox child for `Trust::untrusted`.
template <TensorElement T, class Allocate>
void read_hdf5_dataset(const std::filesystem::path& file, const std::string& name,
                       std::optional<std::size_t> expected_rank, const Hdf5Options& options,
                       Allocate&& allocate) {
  H5::H5File h5 = open_hdf5_for_reading(file);
  try {
    const H5::DataSet data = open_hdf5_dataset(h5, file, name);
    check_hdf5_type_class<T>(data, file, name);
    const Shape shape = hdf5_dataset_shape(data, file, name);
    if (expected_rank && *expected_rank != shape.rank()) {
      throw ShapeError(hdf5_file_name(file) + ": dataset '" + name + "' has rank " +
                       std::to_string(shape.rank()) + " (shape " + shape.str() + ") but rank " +
                       std::to_string(*expected_rank) + " was expected");
    }
    const std::size_t bytes = checked_hdf5_read_bytes(
        hdf5_file_name(file) + ": dataset '" + name + "'", shape, sizeof(T), options);
    check_hdf5_storage(data, file, name, shape, sizeof(T), options);
    T* out = allocate(shape, bytes);
    if (bytes != 0) data.read(out, hdf5_native_type<T>());
  } catch (const H5::Exception& error) {
    throw FormatError(hdf5_file_name(file) + ": cannot read dataset '" + name + "' (" +
                      hdf5_reason(error) + ")");
  }
}

/// `read_hdf5` for `Trust::untrusted`: a sandbox child parses the file and reads the dataset
/// into a memfd, which the returned tensor maps (no copy); the child reports the shape.
template <TensorElement T>
Tensor<T> read_hdf5_sandboxed(const std::filesystem::path& file, const std::string& name,
                              std::optional<std::size_t> expected_rank,
                              const Hdf5Options& options) {
  const std::string where = hdf5_file_name(file);
  const int memfd = ::memfd_create("loadstar-hdf5", MFD_CLOEXEC);
  if (memfd < 0) {
    throw IoError(where + ": cannot create shared memory for a sandbox process (" +
                  std::strerror(errno) + ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{memfd};
  // The child inherits HDF5's state: no other thread may be inside HDF5 when it forks.
  const std::string report = run_sandboxed(
      where, "reading dataset '" + name + "'", hdf5_mutex(),
      [&]() -> std::string {
        Hdf5Lock::configure_errors();
        Shape read_shape;
        read_hdf5_dataset<T>(
            file, name, expected_rank, options, [&](const Shape& shape, std::size_t bytes) -> T* {
              read_shape = shape;
              if (bytes == 0) return nullptr;
              if (::ftruncate(memfd, static_cast<off_t>(bytes)) != 0) {
                throw IoError(where + ": cannot size " + std::to_string(bytes) +
                              " bytes of shared memory (" + std::strerror(errno) + ")");
              }
              void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
              if (memory == MAP_FAILED) {
                throw IoError(where + ": cannot map " + std::to_string(bytes) +
                              " bytes of shared memory (" + std::strerror(errno) + ")");
              }
              return static_cast<T*>(memory);
            });
        std::string shape_bytes(1, static_cast<char>(read_shape.rank()));
        for (const std::uint64_t d : read_shape)
          shape_bytes.append(reinterpret_cast<const char*>(&d), sizeof d);
        return shape_bytes;
      },
      options.sandbox_deadline);
  const std::size_t rank = report.empty() ? 0 : static_cast<unsigned char>(report[0]);
  if (report.size() != 1 + rank * sizeof(std::uint64_t) || rank > Shape::max_rank) {
    throw FormatError(where + ": the sandbox process reading dataset '" + name +
                      "' sent a malformed report");
  }
  std::uint64_t dims[Shape::max_rank];
  std::memcpy(dims, report.data() + 1, rank * sizeof(std::uint64_t));
  const Shape shape(std::span<const std::uint64_t>(dims, rank));
  const std::size_t bytes = shape.bytes(sizeof(T));
  if (bytes == 0) return Tensor<T>::uninitialized(shape);
  struct stat info {};
  if (::fstat(memfd, &info) != 0 || static_cast<std::uint64_t>(info.st_size) != bytes) {
    throw FormatError(where + ": the sandbox process reading dataset '" + name + "' wrote " +
                      std::to_string(info.st_size) + " bytes but shape " + shape.str() + " needs " +
                      std::to_string(bytes));
  }
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (memory == MAP_FAILED) {
    throw IoError(where + ": cannot map the " + std::to_string(bytes) +
                  " bytes the sandbox process read (" + std::strerror(errno) + ")");
  }
  std::shared_ptr<void> owner(memory, [bytes](void* p) { ::munmap(p, bytes); });
  return Tensor<T>::wrap(static_cast<T*>(memory), shape, std::move(owner));
}

}  // namespace detail

/// Reads dataset `dataset` of HDF5 file `file` whole into a tensor of the stored shape.
///
/// The stored type class must be `T`'s: integers are read as an integer `T`, floats as a
/// floating-point `T`, with HDF5 converting sizes and signedness (float64 read as `float`,
/// uint8 read as `std::int64_t`; out-of-range integers saturate). A scalar dataset gives a
/// rank-0 tensor. Safe to call from several threads: every HDF5 call holds one process-wide lock.
///
/// The file is not trusted unless `options.trust` says so: libhdf5 parses it in a forked child
/// process, which reads the dataset into shared memory the returned tensor views, so a file that
/// crashes libhdf5 gives a `FormatError` (see `hdf5_options.hpp`). Sizes are checked against
/// `options.max_bytes`, `options.max_fill_bytes` and the file before anything is allocated.
/// \code
/// auto images = read_hdf5<float>("mnist.h5", "/train/x", 2);       // (60000, 784)
/// auto labels = read_hdf5<std::int64_t>("mnist.h5", "/train/y");   // stored as uint8
/// auto mine = read_hdf5<float>("mine.h5", "x", {}, {.trust = Trust::trusted});  // no child
/// \endcode
/// \param dataset the dataset's name, absolute (`"/train/x"`) or relative to the root.
/// \param expected_rank when given, the rank the dataset must have.
/// \throws IoError when the file is missing or unreadable.
/// \throws FormatError when it is not an HDF5 file, the dataset is missing or not a dataset, its
///         sizes exceed the limits or what the file stores, HDF5 fails to read it, or (untrusted)
///         parsing it kills the child process.
/// \throws ShapeError when the stored type class is not `T`'s or the rank is not `expected_rank`.
template <TensorElement T>
Tensor<T> read_hdf5(const std::filesystem::path& file, const std::string& dataset,
                    std::optional<std::size_t> expected_rank = {}, Hdf5Options options = {}) {
  const std::string name = detail::absolute_dataset_name(dataset);
  if (options.trust == Trust::untrusted) {
    return detail::read_hdf5_sandboxed<T>(file, name, expected_rank, options);
  }
  // The lock is taken first so that every HDF5 object below is also closed under it.
  detail::Hdf5Lock lock;
  Tensor<T> out;
  detail::read_hdf5_dataset<T>(
      file, name, expected_rank, options, [&](const Shape& shape, std::size_t bytes) {
        try {
          out = Tensor<T>::uninitialized(shape);
        } catch (const MemoryError&) {
          throw FormatError(detail::hdf5_file_name(file) + ": cannot allocate " +
                            std::to_string(bytes) + " bytes for dataset '" + name + "'");
        }
        return out.data();
      });
  return out;
}

/// Writes `tensor` as dataset `dataset` of HDF5 file `file`, stored as `T`'s little-endian type
/// (`float` as float32, `std::uint8_t` as uint8). The other datasets of an existing file are
/// kept and a dataset of the same name is replaced; missing parent groups are created.
///
/// Nothing is lost on failure: the file is written under a temporary name beside it and renamed
/// into place (a copy of the existing file, when there is one, is what gets modified).
/// \code
/// write_hdf5("mnist.h5", "/train/x", images);
/// write_hdf5("mnist.h5", "/train/y", labels);   // mnist.h5 now holds both
/// \endcode
/// \throws IoError when the file cannot be read, written or renamed.
/// \throws FormatError when an existing `file` is not an HDF5 file.
template <TensorElement T>
void write_hdf5(const std::filesystem::path& file, const std::string& dataset,
                const Tensor<T>& tensor) {
  namespace fs = std::filesystem;
  const std::string name = detail::absolute_dataset_name(dataset);
  const std::string where = detail::hdf5_file_name(file);
  if (name == "/") throw ConfigError(where + ": cannot write a dataset named '/'");
  static std::atomic<unsigned> counter{0};
  const fs::path temporary =
      file.parent_path() / ("." + file.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                            "-" + std::to_string(counter++));
  // Removes the temporary file on every early exit.
  struct Cleanup {
    const fs::path& path;
    bool armed = true;
    ~Cleanup() {
      std::error_code ignored;
      if (armed) fs::remove(path, ignored);
    }
  } cleanup{temporary};

  detail::Hdf5Lock lock;
  std::error_code error;
  const bool exists = fs::exists(file, error);
  if (exists) {
    detail::check_readable(file);
    if (H5Fis_hdf5(file.c_str()) <= 0) {
      throw FormatError(where + ": expected an hdf5 file but found no hdf5 signature");
    }
    if (!fs::copy_file(file, temporary, fs::copy_options::overwrite_existing, error)) {
      throw IoError(where + ": cannot copy to '" + temporary.string() + "' (" + error.message() +
                    ")");
    }
  }
  try {
    H5::H5File h5(temporary.c_str(), exists ? H5F_ACC_RDWR : H5F_ACC_TRUNC);
    if (detail::hdf5_link_exists(h5, name)) h5.unlink(name);
    H5::LinkCreatPropList link;
    H5Pset_create_intermediate_group(link.getId(), 1);
    const Shape& shape = tensor.shape();
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    const H5::DataSpace space = shape.rank() == 0
                                    ? H5::DataSpace(H5S_SCALAR)
                                    : H5::DataSpace(static_cast<int>(dims.size()), dims.data());
    const H5::DataSet data =
        h5.createDataSet(name, detail::hdf5_file_type<T>(), space, H5::DSetCreatPropList::DEFAULT,
                         H5::DSetAccPropList::DEFAULT, link);
    if (!tensor.empty()) data.write(tensor.data(), detail::hdf5_native_type<T>());
  } catch (const H5::Exception& failure) {
    throw IoError(where + ": cannot write dataset '" + name + "' (" + detail::hdf5_reason(failure) +
                  ")");
  }
  fs::rename(temporary, file, error);
  if (error) {
    throw IoError(where + ": cannot rename '" + temporary.string() + "' into place (" +
                  error.message() + ")");
  }
  cleanup.armed = false;
}

}  // namespace loadstar
