/// \file
/// `DataLoader`: what a trial's `build_training_data_loader` and `build_validation_data_loader`
/// return, any of Determined's five kinds, type-erased at this one boundary.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/trial/detail/loader_process.hpp"
#include "loadstar/trial/trial_context.hpp"

namespace loadstar::trial {

namespace detail {

/// Rank `rank`'s share of a `Sequence` for one validation pass: batches `rank, rank + size, ...`,
/// so that the ranks together read every batch once (Determined's validation sharding).
template <class S>
struct StridedSequence {
  S sequence;
  std::size_t rank = 0;
  std::size_t ranks = 1;
  std::size_t size() const {
    const std::size_t n = sequence.size();
    return n > rank ? (n - rank + ranks - 1) / ranks : 0;
  }
  decltype(auto) operator[](std::size_t i) const { return sequence[rank + i * ranks]; }
};

}  // namespace detail

/// A trial's data: `(x, y)` or `(x, y, sample_weights)` arrays (batched by the per-slot batch
/// size, the last batch partial, as Determined's `_ArrayLikeAdapter`), a Keras `Sequence` (served
/// with `configure_fit`'s workers, processes, queue size and shuffling), a `Dataset` (owned, or
/// shared through a `shared_ptr`) or a `SequenceAdapter` (shared). Any other type does not
/// compile; an empty loader is a `ConfigError` when the runner reads it.
/// \code
/// DataLoader build_training_data_loader() override { return {x_train, y_train}; }
/// \endcode
class DataLoader {
 public:
  DataLoader() = default;

  template <ArrayLike X, ArrayLike Y>
  DataLoader(X x, Y y) : kind_("arrays") {
    auto data = std::make_shared<std::pair<X, Y>>(std::move(x), std::move(y));
    training_ = [data](const keras::DataIteratorOptions& s) {
      return keras::make_data_iterator(data->first, data->second, s);
    };
    validate_ = [data](keras::Model& model, const keras::DataIteratorOptions& s,
                       std::optional<std::size_t> steps) {
      return model.evaluate(data->first, data->second,
                            {.batch_size = s.batch_size,
                             .verbose = 0,
                             .steps = steps,
                             .shard_rank = s.adapter.sampler.rank,
                             .num_shards = s.adapter.sampler.size});
    };
  }

  template <ArrayLike X, ArrayLike Y>
  DataLoader(X x, Y y, Tensor<float> sample_weights) : kind_("arrays with sample weights") {
    struct Arrays {
      X x;
      Y y;
      Tensor<float> w;
    };
    auto data =
        std::make_shared<Arrays>(Arrays{std::move(x), std::move(y), std::move(sample_weights)});
    training_ = [data](const keras::DataIteratorOptions& s) {
      return keras::make_data_iterator(data->x, data->y, data->w, s);
    };
    validate_ = [data](keras::Model& model, const keras::DataIteratorOptions& s,
                       std::optional<std::size_t> steps) {
      return model.evaluate(data->x, data->y,
                            {.batch_size = s.batch_size,
                             .verbose = 0,
                             .sample_weight = data->w,
                             .steps = steps,
                             .shard_rank = s.adapter.sampler.rank,
                             .num_shards = s.adapter.sampler.size});
    };
  }

  /// A Keras `Sequence` (copied for every pass: it should be cheap to copy, as the array
  /// sequences and file readers are).
  template <KerasSequence S>
  requires(!ArrayLike<S>) DataLoader(S sequence) : kind_("Sequence") {
    forks_ = [](const keras::DataIteratorOptions& s) {
      return s.use_multiprocessing && s.adapter.workers.value_or(0) > 0;
    };
    auto data = std::make_shared<S>(std::move(sequence));
    training_ = [data](const keras::DataIteratorOptions& s) {
      return keras::make_data_iterator(*data, s);
    };
    validate_ = [data](keras::Model& model, const keras::DataIteratorOptions& s,
                       std::optional<std::size_t> steps) {
      if (const SamplerOptions& shard = s.adapter.sampler; shard.size > 1) {
        return model.evaluate(detail::StridedSequence<S>{*data, shard.rank, shard.size},
                              {.verbose = 0, .steps = steps});
      }
      return model.evaluate(*data, {.verbose = 0, .steps = steps});
    };
  }

  /// A `Dataset`, owned; every validation reads it from its start (`reset()`).
  template <Dataset D>
  requires KerasBatch<element_t<D>> DataLoader(D dataset)
      : DataLoader(std::make_shared<D>(std::move(dataset))) {}

  /// A `Dataset` shared with the caller.
  template <Dataset D>
  requires KerasBatch<element_t<D>> DataLoader(std::shared_ptr<D> dataset) : kind_("Dataset") {
    if (!dataset) throw ConfigError("data loader: the Dataset is null");
    training_ = [dataset](const keras::DataIteratorOptions&) {
      return keras::make_data_iterator(*dataset);
    };
    validate_ = [dataset](keras::Model& model, const keras::DataIteratorOptions&,
                          std::optional<std::size_t> steps) {
      dataset->reset();
      return model.evaluate(*dataset, {.verbose = 0, .steps = steps});
    };
  }

  /// A `SequenceAdapter` (not copyable, so shared), read as Determined 0.13.10+ reads one: as a
  /// holder of its sequence and settings (`_data.py@0.15.6`): training reads a copy of the
  /// sequence with the adapter's workers, processes, queue size and shuffling (these override
  /// `configure_fit`'s), shuffled with the trial seed, so that a resume can rebuild it at the saved
  /// position; validation reads the sequence in order.
  template <Sequence S, std::size_t Workers, bool Multiprocess>
  requires KerasBatch<batch_t<S>> DataLoader(
      std::shared_ptr<SequenceAdapter<S, Workers, Multiprocess>> adapter)
      : kind_("SequenceAdapter") {
    if (!adapter) throw ConfigError("data loader: the SequenceAdapter is null");
    forks_ = [](const keras::DataIteratorOptions&) { return Multiprocess; };
    training_ = [adapter](const keras::DataIteratorOptions& s) {
      keras::DataIteratorOptions options = s;
      options.adapter.workers = adapter->worker_count();
      options.use_multiprocessing = Multiprocess;
      options.adapter.max_queue_size = adapter->options().max_queue_size;
      options.adapter.sampler.shuffle = adapter->options().sampler.shuffle;
      return keras::make_data_iterator(S(adapter->sequence()), options);
    };
    validate_ = [adapter](keras::Model& model, const keras::DataIteratorOptions& s,
                          std::optional<std::size_t> steps) {
      if (const SamplerOptions& shard = s.adapter.sampler; shard.size > 1) {
        return model.evaluate(
            detail::StridedSequence<S>{S(adapter->sequence()), shard.rank, shard.size},
            {.verbose = 0, .steps = steps});
      }
      return model.evaluate(S(adapter->sequence()), {.verbose = 0, .steps = steps});
    };
  }

  /// Whether the loader holds data.
  bool empty() const noexcept { return !training_; }
  /// `arrays`, `arrays with sample weights`, `Sequence`, `Dataset` or `SequenceAdapter` (empty
  /// for an empty loader).
  const std::string& kind() const noexcept { return kind_; }

  /// Whether reading the training data forks worker processes (a `Sequence` with
  /// `use_multiprocessing`, a `SequenceAdapter` of processes) under the `configure_fit` settings
  /// (`TrialContext::data_options`).
  bool forks_processes(const keras::DataIteratorOptions& options) const {
    return forks_ && forks_(options);
  }

  /// This loader with its training batches read from `process` (a loader process forked before
  /// `MPI_Init`, which builds the same loader and serves it); validation stays as it is.
  LOADSTAR_DECL DataLoader served_by(std::shared_ptr<detail::LoaderProcess> process) const;

  /// The training batches read with `options` (`TrialContext::data_options`: the per-slot batch
  /// size, the `configure_fit` settings, the trial seed and this rank's shard), an endless stream
  /// of epochs with a checkpointable position; no model is needed to read them.
  LOADSTAR_DECL keras::DataIterator training(const keras::DataIteratorOptions& options,
                                             std::string_view what = "training data loader") const;

  /// The loss and metrics of one validation pass (`steps` batches at most) of `model`, read with
  /// the batch size and the shard of `options`.
  LOADSTAR_DECL keras::Logs validate(keras::Model& model, const keras::DataIteratorOptions& options,
                                     std::optional<std::size_t> steps,
                                     std::string_view what = "validation data loader") const;

 private:
  LOADSTAR_DECL void require(std::string_view what) const;

  std::string kind_;
  std::function<bool(const keras::DataIteratorOptions&)> forks_;
  std::function<keras::DataIterator(const keras::DataIteratorOptions&)> training_;
  std::function<keras::Logs(keras::Model&, const keras::DataIteratorOptions&,
                            std::optional<std::size_t>)>
      validate_;
};

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

DataLoader DataLoader::served_by(std::shared_ptr<detail::LoaderProcess> process) const {
  DataLoader out = *this;
  out.training_ = [process](const keras::DataIteratorOptions&) {
    return keras::DataIterator(std::make_unique<detail::RemoteSource>(process));
  };
  return out;
}

keras::DataIterator DataLoader::training(const keras::DataIteratorOptions& options,
                                         std::string_view what) const {
  require(what);
  return training_(options);
}

keras::Logs DataLoader::validate(keras::Model& model, const keras::DataIteratorOptions& options,
                                 std::optional<std::size_t> steps, std::string_view what) const {
  require(what);
  return validate_(model, options, steps);
}

void DataLoader::require(std::string_view what) const {
  if (empty()) {
    throw ConfigError(std::string(what) +
                      ": expected (x, y), (x, y, sample_weights), a Sequence, a Dataset or a "
                      "SequenceAdapter but found an empty data loader");
  }
}

}  // namespace loadstar::trial
#endif
