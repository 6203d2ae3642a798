/// \file
/// `from_hdf5`: the rows of two HDF5 datasets, read lazily, as the elements of a dataset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>

#include "loadstar/data/dataset/from_sequence.hpp"
#include "loadstar/data/dataset/unbatch.hpp"
#include "loadstar/data/hdf5_options.hpp"
#include "loadstar/data/hdf5_sequence.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The rows `(x_row, y_row)` of the datasets `x_dataset` and `y_dataset` of an HDF5 file, read
/// lazily `read_rows` rows at a time with hyperslab selections (an `Hdf5Sequence` unbatched), so
/// files larger than memory stream from disk. The state is a chunk index and a row within it: a
/// restore reads one chunk. Throws as `Hdf5Sequence` does, and `ConfigError` for `read_rows` of 0.
/// The file is checked as `options.trust` says, once (see `Hdf5Options`).
/// \code
/// auto train = from_hdf5<float, std::int64_t>("mnist.h5", "/train/x", "/train/y")
///                  .shuffle(10000, seed).batch(32);
/// \endcode
template <TensorElement TX, TensorElement TY>
auto from_hdf5(const std::filesystem::path& file, const std::string& x_dataset,
               const std::string& y_dataset, std::size_t read_rows = 256,
               Hdf5Options options = {}) {
  if (read_rows == 0) throw ConfigError("from_hdf5: read_rows must be positive but is 0");
  // Open once to learn the row count: a chunk may not be larger than the data. That first
  // opening checked the file as `options.trust` says; the second need not again.
  const std::size_t rows = Hdf5Sequence<TX, TY>(file, x_dataset, y_dataset, 1, {}, options).rows();
  Hdf5Options checked = options;
  checked.trust = Trust::trusted;
  return from_sequence(Hdf5Sequence<TX, TY>(file, x_dataset, y_dataset, std::min(read_rows, rows),
                                            {}, checked))
      .unbatch();
}

}  // namespace loadstar
