/// \file
/// `DataIterator`: the batches of any loader kind, one epoch at a time, with a checkpointable
/// position (Keras 3's `EpochIterator`).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/batch.hpp"

namespace loadstar::keras {

/// The batch view the steps take: the members of `x`, `y` and the sample weights of one batch,
/// whatever loader and element types they came from (`Model::train_step` accepts it and every
/// batch kind `fit` takes).
using BatchView = detail::ErasedBatch;

/// The batches of arrays, a `Sequence`, a `Dataset` or a `SequenceAdapter`, as `fit` reads them:
/// epoch by epoch, with `state()` before the next batch and `restore()` to continue from it in a
/// new process. `Model::make_data_iterator` makes one from the same arguments as `fit`;
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

}  // namespace loadstar::keras

// The definitions of what is declared above: in every translation unit when header-only, in
// the library alone when separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

LOADSTAR_DECL DataIterator::DataIterator(std::unique_ptr<detail::BatchSource> source)
    : source_(std::move(source)) {
  if (!source_) throw ConfigError("data iterator: the batch source is null");
}

}  // namespace loadstar::keras
#endif
