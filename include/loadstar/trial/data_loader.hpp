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

/// How the runner reads a loader: the batch size of arrays, the `configure_fit` settings and the
/// seed of shuffling.
struct LoaderSettings {
  std::size_t batch_size = 32;
  FitSettings fit = {};
  std::uint64_t seed = 0;
  /// This rank and the trial's number of ranks: each reads its shard of every loader.
  std::size_t rank = 0;
  std::size_t size = 1;
};

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
    training_ = [data](keras::Model& model, const LoaderSettings& s) {
      return model.make_data_iterator(data->first, data->second, fit_options(s));
    };
    validate_ = [data](keras::Model& model, const LoaderSettings& s,
                       std::optional<std::size_t> steps) {
      return model.evaluate(data->first, data->second,
                            {.batch_size = s.batch_size,
                             .verbose = 0,
                             .steps = steps,
                             .shard_rank = s.rank,
                             .num_shards = s.size});
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
    training_ = [data](keras::Model& model, const LoaderSettings& s) {
      auto options = fit_options(s);
      options.sample_weight = data->w;
      return model.make_data_iterator(data->x, data->y, options);
    };
    validate_ = [data](keras::Model& model, const LoaderSettings& s,
                       std::optional<std::size_t> steps) {
      return model.evaluate(data->x, data->y,
                            {.batch_size = s.batch_size,
                             .verbose = 0,
                             .sample_weight = data->w,
                             .steps = steps,
                             .shard_rank = s.rank,
                             .num_shards = s.size});
    };
  }

  /// A Keras `Sequence` (copied for every pass: it should be cheap to copy, as the array
  /// sequences and file readers are).
  template <KerasSequence S>
  requires(!ArrayLike<S>) DataLoader(S sequence) : kind_("Sequence") {
    forks_ = [](const FitSettings& fit) { return fit.use_multiprocessing && fit.workers > 0; };
    auto data = std::make_shared<S>(std::move(sequence));
    training_ = [data](keras::Model& model, const LoaderSettings& s) {
      return model.make_data_iterator(*data, fit_options(s));
    };
    validate_ = [data](keras::Model& model, const LoaderSettings& s,
                       std::optional<std::size_t> steps) {
      if (s.size > 1) {
        return model.evaluate(detail::StridedSequence<S>{*data, s.rank, s.size},
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
    training_ = [dataset](keras::Model& model, const LoaderSettings&) {
      return model.make_data_iterator(*dataset);
    };
    validate_ = [dataset](keras::Model& model, const LoaderSettings&,
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
    forks_ = [](const FitSettings&) { return Multiprocess; };
    training_ = [adapter](keras::Model& model, const LoaderSettings& s) {
      auto options = fit_options(s);
      options.workers = adapter->worker_count();
      options.use_multiprocessing = Multiprocess;
      options.max_queue_size = adapter->options().max_queue_size;
      options.shuffle = adapter->options().shuffle;
      return model.make_data_iterator(S(adapter->sequence()), options);
    };
    validate_ = [adapter](keras::Model& model, const LoaderSettings& s,
                          std::optional<std::size_t> steps) {
      if (s.size > 1) {
        return model.evaluate(detail::StridedSequence<S>{S(adapter->sequence()), s.rank, s.size},
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
  /// `use_multiprocessing`, a `SequenceAdapter` of processes) under the `configure_fit` settings.
  bool forks_processes(const FitSettings& fit) const { return forks_ && forks_(fit); }

  /// This loader with its training batches read from `process` (a loader process forked before
  /// `MPI_Init`, which builds the same loader and serves it); validation stays as it is.
  LOADSTAR_DECL DataLoader served_by(std::shared_ptr<detail::LoaderProcess> process) const;

  /// The training batches, an endless stream of epochs with a checkpointable position.
  LOADSTAR_DECL keras::DataIterator training(keras::Model& model, const LoaderSettings& settings,
                                             std::string_view what = "training data loader") const;

  /// The loss and metrics of one validation pass (`steps` batches at most).
  LOADSTAR_DECL keras::Logs validate(keras::Model& model, const LoaderSettings& settings,
                                     std::optional<std::size_t> steps,
                                     std::string_view what = "validation data loader") const;

 private:
  LOADSTAR_DECL static keras::FitOptions fit_options(const LoaderSettings& s);

  LOADSTAR_DECL void require(std::string_view what) const;

  std::string kind_;
  std::function<bool(const FitSettings&)> forks_;
  std::function<keras::DataIterator(keras::Model&, const LoaderSettings&)> training_;
  std::function<keras::Logs(keras::Model&, const LoaderSettings&, std::optional<std::size_t>)>
      validate_;
};

}  // namespace loadstar::trial

// The definitions of what is declared above: in every translation unit when header-only, in
// the library alone when separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

LOADSTAR_DECL DataLoader
DataLoader::served_by(std::shared_ptr<detail::LoaderProcess> process) const {
  DataLoader out = *this;
  out.training_ = [process](keras::Model&, const LoaderSettings&) {
    return keras::DataIterator(std::make_unique<detail::RemoteSource>(process));
  };
  return out;
}

LOADSTAR_DECL keras::DataIterator DataLoader::training(keras::Model& model,
                                                       const LoaderSettings& settings,
                                                       std::string_view what) const {
  require(what);
  return training_(model, settings);
}

LOADSTAR_DECL keras::Logs DataLoader::validate(keras::Model& model, const LoaderSettings& settings,
                                               std::optional<std::size_t> steps,
                                               std::string_view what) const {
  require(what);
  return validate_(model, settings, steps);
}

LOADSTAR_DECL keras::FitOptions DataLoader::fit_options(const LoaderSettings& s) {
  keras::FitOptions options;
  options.batch_size = s.batch_size;
  options.shuffle = s.fit.shuffle;
  options.seed = s.seed;
  options.workers = s.fit.workers;
  options.use_multiprocessing = s.fit.use_multiprocessing;
  options.max_queue_size = s.fit.max_queue_size;
  options.shard_rank = s.rank;
  options.num_shards = s.size;
  return options;
}

LOADSTAR_DECL void DataLoader::require(std::string_view what) const {
  if (empty()) {
    throw ConfigError(std::string(what) +
                      ": expected (x, y), (x, y, sample_weights), a Sequence, a Dataset or a "
                      "SequenceAdapter but found an empty data loader");
  }
}

}  // namespace loadstar::trial
#endif
