/// \file
/// `Hdf5Sequence`: datasets `x` and `y` of an HDF5 file served as a Keras `Sequence`, each batch
/// read from disk on demand.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loadstar/data/array_sequence.hpp"
#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/data/detail/sandbox.hpp"
#include "loadstar/data/hdf5_options.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

namespace detail {

/// The open file and datasets of an `Hdf5Sequence`, shared by its copies. Every member is used
/// under `hdf5_mutex()`, including in the destructor, which closes the HDF5 handles.
struct Hdf5SequenceState {
  std::filesystem::path path;
  std::string x_name;
  std::string y_name;
  pid_t pid = 0;  // the process that opened `file`
  std::optional<H5::H5File> file;
  std::optional<H5::DataSet> x;
  std::optional<H5::DataSet> y;

  Hdf5SequenceState(std::filesystem::path path_, std::string x_name_, std::string y_name_)
      : path(std::move(path_)), x_name(std::move(x_name_)), y_name(std::move(y_name_)) {}
  Hdf5SequenceState(const Hdf5SequenceState&) = delete;
  Hdf5SequenceState& operator=(const Hdf5SequenceState&) = delete;

  ~Hdf5SequenceState() {
    Hdf5Lock lock;
    close();
  }

  void close() noexcept {
    x.reset();
    y.reset();
    file.reset();
  }

  /// Opens the file and datasets in this process (caller holds `Hdf5Lock`). In a forked child
  /// the handles inherited from the parent are closed first and the file opened afresh, so the
  /// child has its own file descriptor and HDF5 state rather than sharing the parent's.
  void open_in_this_process() {
    const pid_t self = ::getpid();
    if (file && pid == self) return;
    close();
    file.emplace(open_hdf5_for_reading(path));
    x.emplace(open_hdf5_dataset(*file, path, x_name));
    y.emplace(open_hdf5_dataset(*file, path, y_name));
    pid = self;
  }
};

/// Reads rows `[begin, end)` of `dataset`, whose shape is `shape`, into `out` with a hyperslab
/// selection (caller holds `Hdf5Lock`).
template <TensorElement T>
void read_hdf5_rows(const H5::DataSet& dataset, const Shape& shape, std::size_t begin,
                    std::size_t end, const Tensor<T>& out) {
  if (out.empty()) return;
  std::vector<hsize_t> start(shape.rank(), 0);
  std::vector<hsize_t> count(shape.begin(), shape.end());
  start[0] = begin;
  count[0] = end - begin;
  H5::DataSpace file_space = dataset.getSpace();
  file_space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
  const H5::DataSpace memory_space(static_cast<int>(count.size()), count.data());
  dataset.read(out.data(), hdf5_native_type<T>(), memory_space, file_space);
}

}  // namespace detail

/// Datasets `x` and `y` of one HDF5 file as a Keras `Sequence` of `(x, y)` batches, with the
/// batch semantics of `ArraySequence`: `size()` is `ceil(rows / batch_size)` (`floor` with
/// `drop_leftovers`) and batch `i` holds rows `[i * batch_size, min((i + 1) * batch_size, rows))`.
///
/// Nothing is loaded whole: each batch is read with a hyperslab selection when it is asked for,
/// so data larger than memory stream from disk. The stored types convert as in `read_hdf5`
/// (integers to `TX`/`TY` integers, floats to floats). `operator[]` may be called from several
/// threads (HDF5 calls are serialised by one process-wide lock) and from forked children (each
/// process opens the file for itself on first use). Copies share the open file.
/// \code
/// Hdf5Sequence<float, std::int64_t> train("mnist.h5", "/train/x", "/train/y", 32);
/// for (std::size_t i = 0; i < train.size(); ++i) {
///   auto [x, y] = train[i];   // x: (32, 28, 28) float, y: (32,) int64
/// }
/// \endcode
template <TensorElement TX, TensorElement TY>
class Hdf5Sequence {
 public:
  using batch_type = std::tuple<Tensor<TX>, Tensor<TY>>;

  /// Opens `file` and checks both datasets. Throws `IoError` and `FormatError` as `read_hdf5`
  /// does, `ShapeError` for a type class that is not `TX`'s or `TY`'s, a scalar or empty dataset
  /// or row counts that differ, and `ConfigError` for a batch size of 0 or larger than the data.
  ///
  /// Unless `hdf5.trust` is `Trust::trusted`, a forked child first opens the file and reads
  /// every row of both datasets once (in blocks of at most 16 MiB), so that a file that crashes
  /// libhdf5 gives a `FormatError` here rather than ending the process in a later `operator[]`.
  /// The file must not change while the sequence is in use.
  Hdf5Sequence(const std::filesystem::path& file, const std::string& x_dataset,
               const std::string& y_dataset, std::size_t batch_size, ArrayOptions options = {},
               Hdf5Options hdf5 = {})
      : state_(std::make_shared<detail::Hdf5SequenceState>(
            file, detail::absolute_dataset_name(x_dataset),
            detail::absolute_dataset_name(y_dataset))),
        batch_size_(batch_size) {
    const std::string owner = "hdf5 sequence over '" + file.string() + "'";
    if (hdf5.trust == Trust::untrusted) {
      detail::run_sandboxed(
          detail::hdf5_file_name(file),
          "checking datasets '" + state_->x_name + "' and '" + state_->y_name + "'",
          detail::hdf5_mutex(),
          [&] {
            detail::Hdf5Lock::configure_errors();
            check_in_child(file, hdf5);
            return std::string();
          },
          hdf5.sandbox_deadline);
    }
    {
      detail::Hdf5Lock lock;
      try {
        state_->open_in_this_process();
        std::tie(x_shape_, y_shape_) = inspect(*state_->x, *state_->y, file, hdf5);
      } catch (const H5::Exception& error) {
        throw FormatError(detail::hdf5_file_name(file) + ": cannot open datasets '" +
                          state_->x_name + "' and '" + state_->y_name + "' (" +
                          detail::hdf5_reason(error) + ")");
      }
    }
    for (const auto& [shape, name] :
         {std::pair{x_shape_, state_->x_name}, std::pair{y_shape_, state_->y_name}}) {
      if (shape.rank() == 0) {
        throw ShapeError(owner + ": dataset '" + name +
                         "' is a scalar but a sequence needs a batch axis (rank >= 1)");
      }
    }
    rows_ = x_shape_[0];
    if (y_shape_[0] != rows_) {
      throw ShapeError(owner + ": dataset '" + state_->y_name + "' has " +
                       std::to_string(y_shape_[0]) + " rows but dataset '" + state_->x_name +
                       "' has " + std::to_string(rows_));
    }
    if (rows_ == 0) {
      throw ShapeError(owner + ": datasets '" + state_->x_name + "' and '" + state_->y_name +
                       "' have no rows");
    }
    if (batch_size_ == 0) throw ConfigError(owner + ": batch_size must be positive but is 0");
    // Determined's _ArrayLikeAdapter: "Batch size is too large for the input data."
    if (batch_size_ > rows_) {
      throw ConfigError(owner + ": batch_size " + std::to_string(batch_size_) +
                        " is larger than the " + std::to_string(rows_) + " rows of the data");
    }
    // A batch is allocated by every `operator[]`: its size must be within the limit.
    detail::checked_hdf5_read_bytes(owner + ": a batch of dataset '" + state_->x_name + "'",
                                    x_shape_.with_rows(batch_size_), sizeof(TX), hdf5);
    detail::checked_hdf5_read_bytes(owner + ": a batch of dataset '" + state_->y_name + "'",
                                    y_shape_.with_rows(batch_size_), sizeof(TY), hdf5);
    batches_ =
        options.drop_leftovers ? rows_ / batch_size_ : (rows_ + batch_size_ - 1) / batch_size_;
  }

  /// The number of batches.
  std::size_t size() const noexcept { return batches_; }
  /// The number of rows of the datasets.
  std::size_t rows() const noexcept { return rows_; }
  std::size_t batch_size() const noexcept { return batch_size_; }
  /// The shape of the whole `x` dataset.
  const Shape& x_shape() const noexcept { return x_shape_; }
  /// The shape of the whole `y` dataset.
  const Shape& y_shape() const noexcept { return y_shape_; }

  /// Batch `index`, read from the file. Throws `ConfigError` for an index `>= size()`,
  /// `FormatError` when HDF5 fails to read and `IoError` when the file, reopened in a forked
  /// child, can no longer be opened.
  batch_type operator[](std::size_t index) const {
    if (index >= batches_) {
      throw ConfigError("hdf5 sequence over '" + state_->path.string() + "': batch " +
                        std::to_string(index) + " is out of range for a sequence of " +
                        std::to_string(batches_) + " batches");
    }
    const std::size_t begin = index * batch_size_;
    const std::size_t end = std::min(begin + batch_size_, rows_);
    // Allocated before taking the lock, which then covers only HDF5's own work; their sizes
    // were checked against `Hdf5Options::max_bytes` on construction.
    Tensor<TX> x;
    Tensor<TY> y;
    try {
      x = Tensor<TX>::uninitialized(x_shape_.with_rows(end - begin));
      y = Tensor<TY>::uninitialized(y_shape_.with_rows(end - begin));
    } catch (const MemoryError&) {
      throw FormatError(detail::hdf5_file_name(state_->path) + ": cannot allocate rows [" +
                        std::to_string(begin) + ", " + std::to_string(end) + ") of datasets '" +
                        state_->x_name + "' and '" + state_->y_name + "'");
    }
    detail::Hdf5Lock lock;
    try {
      state_->open_in_this_process();
      detail::read_hdf5_rows(*state_->x, x_shape_, begin, end, x);
      detail::read_hdf5_rows(*state_->y, y_shape_, begin, end, y);
    } catch (const H5::Exception& error) {
      throw FormatError(detail::hdf5_file_name(state_->path) + ": cannot read rows [" +
                        std::to_string(begin) + ", " + std::to_string(end) + ") of datasets '" +
                        state_->x_name + "' and '" + state_->y_name + "' (" +
                        detail::hdf5_reason(error) + ")");
    }
    return {std::move(x), std::move(y)};
  }

 private:
  /// The shapes of datasets `x` and `y`, after checking their type classes and storage.
  std::pair<Shape, Shape> inspect(const H5::DataSet& x, const H5::DataSet& y,
                                  const std::filesystem::path& file,
                                  const Hdf5Options& hdf5) const {
    detail::check_hdf5_type_class<TX>(x, file, state_->x_name);
    detail::check_hdf5_type_class<TY>(y, file, state_->y_name);
    Shape x_shape = detail::hdf5_dataset_shape(x, file, state_->x_name);
    Shape y_shape = detail::hdf5_dataset_shape(y, file, state_->y_name);
    detail::check_hdf5_storage(x, file, state_->x_name, x_shape, sizeof(TX), hdf5);
    detail::check_hdf5_storage(y, file, state_->y_name, y_shape, sizeof(TY), hdf5);
    return {x_shape, y_shape};
  }

  /// In a sandbox child: opens the file as the constructor does and reads every row of both
  /// datasets, so that whatever libhdf5 does with the file happens here first. Errors are left
  /// for the constructor to report as it always does, after this child succeeded.
  void check_in_child(const std::filesystem::path& file, const Hdf5Options& hdf5) const {
    const H5::H5File h5 = detail::open_hdf5_for_reading(file);
    try {
      const H5::DataSet x = detail::open_hdf5_dataset(h5, file, state_->x_name);
      const H5::DataSet y = detail::open_hdf5_dataset(h5, file, state_->y_name);
      const auto [x_shape, y_shape] = inspect(x, y, file, hdf5);
      read_every_row<TX>(x, x_shape, hdf5);
      read_every_row<TY>(y, y_shape, hdf5);
    } catch (const H5::Exception& error) {
      throw FormatError(detail::hdf5_file_name(file) + ": cannot read datasets '" + state_->x_name +
                        "' and '" + state_->y_name + "' (" + detail::hdf5_reason(error) + ")");
    }
  }

  template <TensorElement T>
  static void read_every_row(const H5::DataSet& dataset, const Shape& shape,
                             const Hdf5Options& hdf5) {
    if (shape.rank() == 0 || shape.elements() == 0) return;
    constexpr std::size_t block_bytes = std::size_t{16} << 20;
    const std::uint64_t row_bytes = detail::saturating_bytes(shape.row_elements(), sizeof(T));
    if (row_bytes > hdf5.max_bytes) return;  // refused by the constructor
    const auto block =
        static_cast<std::size_t>(std::max<std::uint64_t>(1, block_bytes / row_bytes));
    const auto buffer = Tensor<T>::uninitialized(shape.with_rows(std::min(block, shape[0])));
    for (std::size_t begin = 0; begin < shape[0]; begin += block) {
      const std::size_t end = std::min(begin + block, shape[0]);
      detail::read_hdf5_rows(dataset, shape, begin, end, buffer.slice_rows(0, end - begin));
    }
  }

  std::shared_ptr<detail::Hdf5SequenceState> state_;
  std::size_t batch_size_;
  Shape x_shape_;
  Shape y_shape_;
  std::size_t rows_ = 0;
  std::size_t batches_ = 0;
};

}  // namespace loadstar
