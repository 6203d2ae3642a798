/// \file
/// `read_hdf5` and `write_hdf5`: one named HDF5 dataset to and from a `Tensor`.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// Reads dataset `dataset` of HDF5 file `file` whole into a tensor of the stored shape.
///
/// The stored type class must be `T`'s: integers are read as an integer `T`, floats as a
/// floating-point `T`, with HDF5 converting sizes and signedness (float64 read as `float`,
/// uint8 read as `std::int64_t`; out-of-range integers saturate). A scalar dataset gives a
/// rank-0 tensor. Safe to call from several threads: every HDF5 call holds one process-wide lock.
/// \code
/// auto images = read_hdf5<float>("mnist.h5", "/train/x", 2);       // (60000, 784)
/// auto labels = read_hdf5<std::int64_t>("mnist.h5", "/train/y");   // stored as uint8
/// \endcode
/// \param dataset the dataset's name, absolute (`"/train/x"`) or relative to the root.
/// \param expected_rank when given, the rank the dataset must have.
/// \throws IoError when the file is missing or unreadable.
/// \throws FormatError when it is not an HDF5 file, the dataset is missing or not a dataset, or
///         HDF5 fails to read it.
/// \throws ShapeError when the stored type class is not `T`'s or the rank is not `expected_rank`.
template <TensorElement T>
Tensor<T> read_hdf5(const std::filesystem::path& file, const std::string& dataset,
                    std::optional<std::size_t> expected_rank = {}) {
  const std::string name = detail::absolute_dataset_name(dataset);
  // The lock is taken first so that every HDF5 object below is also closed under it.
  detail::Hdf5Lock lock;
  H5::H5File h5 = detail::open_hdf5_for_reading(file);
  try {
    const H5::DataSet data = detail::open_hdf5_dataset(h5, file, name);
    detail::check_hdf5_type_class<T>(data, file, name);
    const Shape shape = detail::hdf5_dataset_shape(data, file, name);
    if (expected_rank && *expected_rank != shape.rank()) {
      throw ShapeError(detail::hdf5_file_name(file) + ": dataset '" + name + "' has rank " +
                       std::to_string(shape.rank()) + " (shape " + shape.str() + ") but rank " +
                       std::to_string(*expected_rank) + " was expected");
    }
    auto out = Tensor<T>::uninitialized(shape);
    if (!out.empty()) data.read(out.data(), detail::hdf5_native_type<T>());
    return out;
  } catch (const H5::Exception& error) {
    throw FormatError(detail::hdf5_file_name(file) + ": cannot read dataset '" + name + "' (" +
                      detail::hdf5_reason(error) + ")");
  }
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
