/// \file
/// `DataIterator`: the batches of any loader kind, one epoch at a time, with a checkpointable
/// position (Keras 3's `EpochIterator`), and `make_data_iterator`, which makes one from arrays, a
/// `Sequence`, a `Dataset` or a `SequenceAdapter` and its `DataIteratorOptions`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/array_sequence.hpp"
#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/batch.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The batch view the steps take: the members of `x`, `y` and the sample weights of one batch,
/// whatever loader and element types they came from (`Model::train_step` accepts it and every
/// batch kind `fit` takes).
using BatchView = detail::ErasedBatch;

/// The batches of arrays, a `Sequence`, a `Dataset` or a `SequenceAdapter`, as `fit` reads them:
/// epoch by epoch, with `state()` before the next batch and `restore()` to continue from it in a
/// new process. `make_data_iterator` makes one from a loader and its `DataIteratorOptions` (no
/// model needed), `Model::make_data_iterator` from the same arguments as `fit`;
/// `Model::fit(DataIterator&)` trains on it, so that a run interrupted mid-epoch resumes exactly.
/// \code
/// auto data = model.make_data_iterator(x, y, {.batch_size = 32, .seed = 7});
/// model.fit(data, {.epochs = 3});
/// nlohmann::json saved = data.state();  // {"epoch", "step", "sampler": {...}}
/// \endcode
class DataIterator {
 public:
  LOADSTAR_DECL explicit DataIterator(std::unique_ptr<detail::BatchSource> source);

  /// The batches of an epoch, when known.
  std::optional<std::size_t> steps() const { return source_->steps(); }
  /// The largest batch, when known (0 otherwise).
  std::size_t max_batch() const { return source_->max_batch(); }
  /// Starts epoch `epoch` (or, after `restore`, continues it).
  void start_epoch(std::size_t epoch) { source_->start_epoch(epoch); }
  /// Ends the epoch: a `Sequence`'s `on_epoch_end` runs now if the epoch's last batch was taken,
  /// as in Keras (otherwise it runs before the next epoch's first batch).
  void finish_epoch() { source_->finish_epoch(); }
  /// The next batch of the epoch, or null at its end; valid until the next call.
  const BatchView* next() { return source_->next(); }
  /// The batches of the current epoch taken so far.
  std::size_t step() const noexcept { return source_->step(); }
  /// Whether the next `start_epoch` continues a restored state.
  bool resuming() const noexcept { return source_->resuming(); }
  /// Whether `start_epoch(epoch)` continues a restored state in the middle of `epoch`.
  bool continues(std::size_t epoch) const noexcept { return source_->continues(epoch); }
  /// Whether batches carry targets.
  bool has_targets() const { return source_->has_targets(); }

  /// The position before the next batch, as JSON (O(1) in the data).
  nlohmann::json state() const { return source_->state(); }
  /// Continues from `state()`; throws `CheckpointError` for a state of another kind of loader
  /// or another data layout.
  void restore(const nlohmann::json& state) { source_->restore(state); }

 private:
  std::unique_ptr<detail::BatchSource> source_;
};

/// How `make_data_iterator` reads a loader: the batch size of arrays, the batches per epoch, and
/// the `SequenceAdapter` options that serve a `Sequence`, whose `sampler` (shuffling, its seed,
/// this rank and the number of ranks) orders and shards arrays and sequences alike. The defaults
/// are `fit`'s, except the seed (0 here; `fit` takes `set_random_seed`'s).
/// \code
/// auto data = make_data_iterator(
///     sequence, {.adapter = {.workers = 2, .sampler = {.shuffle = true, .seed = 7}}});
/// \endcode
struct DataIteratorOptions {
  /// Rows per batch for arrays (a `Sequence` or `Dataset` makes its own batches).
  std::size_t batch_size = 32;
  /// Batches per epoch (default: one pass over the data).
  std::optional<std::size_t> steps_per_epoch = {};
  /// `Sequence` only: build batches in forked processes (the batch type must be `Serializable`).
  bool use_multiprocessing = false;
  /// `Sequence` only: the prefetch queue and the workers (exactly as many as asked for, at most
  /// `AdapterOptions::max_workers`; 0 builds batches on the training thread). Arrays and
  /// sequences: the order and shard, `sampler` (Keras shuffles by default). Arrays are sharded by
  /// row (step `k` of every rank together covers the global batch of `batch_size * size` rows,
  /// and every rank has the same steps per epoch), a `Sequence` by batch (rank `r` takes batches
  /// `r, r + size, ...` of the stream). An `adapter` given replaces the whole default: the one
  /// worker and shuffling are then what it says (`AdapterOptions` does not shuffle by default).
  AdapterOptions adapter = {.workers = 1, .sampler = {.shuffle = true}};
};

namespace detail {

/// The source of arrays with sample weights `w`: checks the arrays as Determined's array adapter
/// does, except that a batch larger than the data is one batch of every row, as in Keras. Errors
/// are named after `fit`, which users call.
template <ArrayLike X, ArrayLike Y>
std::unique_ptr<BatchSource> array_source(const X& x, const Y& y,
                                          const std::optional<Tensor<float>>& w,
                                          const DataIteratorOptions& options) {
  const std::size_t x_rows = rows_of(x, "x", "fit");
  const std::size_t y_rows = rows_of(y, "y", "fit");
  if (y_rows != x_rows) {
    throw ShapeError("fit: y has " + std::to_string(y_rows) + " rows but x has " +
                     std::to_string(x_rows) + " (x and y need one row per sample)");
  }
  if (w && w->rank() >= 1 && w->rows() != x_rows) {
    throw ShapeError("fit: sample_weight has " + std::to_string(w->rows()) + " rows but x has " +
                     std::to_string(x_rows) + " (one weight per sample)");
  }
  const std::size_t batch_size = std::min(options.batch_size, x_rows);
  const std::size_t rows =
      w ? ArraySequence(x, y, *w, batch_size).rows() : ArraySequence(x, y, batch_size).rows();
  const SamplerOptions& order = options.adapter.sampler;
  return std::make_unique<ArraySource<X, Y>>(x, y, w, rows, batch_size, order.shuffle, order.seed,
                                             options.steps_per_epoch, order.rank, order.size, true);
}

}  // namespace detail

/// The batches of arrays (`x` and `y` each a tensor of any element type, a list, a map by name or
/// a tuple of tensors): `batch_size` rows, shuffled every epoch when `adapter.sampler.shuffle`,
/// at most `steps_per_epoch` batches an epoch.
template <ArrayLike X, ArrayLike Y>
DataIterator make_data_iterator(const X& x, const Y& y, const DataIteratorOptions& options = {}) {
  return DataIterator(detail::array_source(x, y, std::nullopt, options));
}

/// The batches of arrays with one weight per row.
template <ArrayLike X, ArrayLike Y>
DataIterator make_data_iterator(const X& x, const Y& y, const Tensor<float>& sample_weight,
                                const DataIteratorOptions& options = {}) {
  return DataIterator(detail::array_source(x, y, sample_weight, options));
}

/// The batches of a Keras `Sequence`: a `SequenceAdapter` with the options' workers, processes,
/// queue size and order, owned by the iterator (a restore re-creates it).
template <KerasSequence S>
requires(!ArrayLike<std::remove_cvref_t<S>>) DataIterator
    make_data_iterator(S sequence, const DataIteratorOptions& options = {}) {
  std::unique_ptr<detail::BatchSource> source;
  if (!options.use_multiprocessing) {
    source = std::make_unique<detail::OwnedAdapterSource<S, dynamic_workers, false>>(
        std::move(sequence), options.adapter, options.steps_per_epoch);
  } else if (options.adapter.workers.value_or(0) == 0) {
    throw ConfigError("fit: use_multiprocessing needs workers > 0 but workers is 0");
  } else if constexpr (!Serializable<batch_t<S>>) {
    throw ConfigError(
        "fit: use_multiprocessing needs a batch type that can be serialized (tensors, "
        "arithmetic types, strings and containers of them, or a Serializer specialisation)");
  } else {
    source = std::make_unique<detail::OwnedAdapterSource<S, dynamic_workers, true>>(
        std::move(sequence), options.adapter, options.steps_per_epoch);
  }
  return DataIterator(std::move(source));
}

/// The batches of a `Dataset` (the caller's, by reference): an epoch is one pass, or
/// `steps_per_epoch` elements of the stream.
template <Dataset D>
requires KerasBatch<element_t<D>> DataIterator
make_data_iterator(D& dataset, const DataIteratorOptions& options = {}) {
  return DataIterator(
      std::make_unique<detail::DatasetSource<D&>>(dataset, options.steps_per_epoch));
}

/// The batches of the caller's `SequenceAdapter` (by reference), which keeps its own options: an
/// epoch is `steps_per_epoch` batches, by default one pass over the sequence.
template <Sequence S, std::size_t Workers, bool Multiprocess>
requires KerasBatch<batch_t<S>> DataIterator make_data_iterator(
    SequenceAdapter<S, Workers, Multiprocess>& adapter, const DataIteratorOptions& options = {}) {
  return DataIterator(
      std::make_unique<detail::AdapterSource<SequenceAdapter<S, Workers, Multiprocess>>>(
          adapter, options.steps_per_epoch));
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

DataIterator::DataIterator(std::unique_ptr<detail::BatchSource> source)
    : source_(std::move(source)) {
  if (!source_) throw ConfigError("data iterator: the batch source is null");
}

}  // namespace loadstar::keras
#endif
