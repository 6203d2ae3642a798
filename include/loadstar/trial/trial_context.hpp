/// \file
/// `TrialContext`: what a trial sees of the experiment it runs in (Determined's
/// `TFKerasTrialContext`): its hyperparameters, batch sizes, seed, configuration and the
/// `configure_fit` arguments, and the stop request.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/data/class_weight.hpp"
#include "loadstar/data/dataset/cache_train_dataset.hpp"
#include "loadstar/data/dataset/wrap_dataset.hpp"
#include "loadstar/detail/json_state.hpp"
#include "loadstar/dist/collective.hpp"
#include "loadstar/dist/distributed_optimizer.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/trial/experiment_config.hpp"

namespace loadstar::trial {

/// The arguments of `configure_fit`, with Determined's defaults (`_tf_keras_context.py@0.15.6`).
/// Fields left unset by a call keep their earlier value.
struct FitConfig {
  /// Workload lines and the Keras progress bar on standard output.
  std::optional<bool> verbose = {};
  /// Keras's `class_weight`, applied to batches without sample weights.
  std::optional<ClassWeight> class_weight = {};
  /// `Sequence` loaders: the threads (or processes) building batches ahead; 0: the training thread.
  std::optional<std::size_t> workers = {};
  /// `Sequence` loaders: build batches in forked processes.
  std::optional<bool> use_multiprocessing = {};
  std::optional<std::size_t> max_queue_size = {};
  /// Shuffle the training data every epoch, seeded with the trial seed.
  std::optional<bool> shuffle = {};
  /// Batches per validation (default: one pass over the validation data).
  std::optional<std::size_t> validation_steps = {};
  /// Keras's `validation_freq`: only 1 (Determined's `configure_fit` has no such argument;
  /// validations in a trial follow `min_validation_period` and the searcher), else `ConfigError`.
  std::optional<std::size_t> validation_freq = {};
};

/// The `configure_fit` arguments in force (every default applied).
struct FitSettings {
  bool verbose = true;
  std::optional<ClassWeight> class_weight = {};
  std::size_t workers = 1;
  bool use_multiprocessing = false;
  std::size_t max_queue_size = 10;
  bool shuffle = true;
  /// Whether `configure_fit` set `shuffle` (a `Dataset` or `SequenceAdapter` loader refuses it).
  bool shuffle_given = false;
  std::optional<std::size_t> validation_steps = {};
};

/// `context.distributed`: where this process stands in a data-parallel trial (Determined's
/// `DistributedContext`): its rank among the trial's ranks, their number, its rank on its machine
/// and its machine's index. One process is rank 0 of 1.
struct DistributedContext {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int get_rank() const noexcept { return rank; }
  int get_size() const noexcept { return size; }
  int get_local_rank() const noexcept { return local_rank; }
  int get_local_size() const noexcept { return local_size; }
  int get_cross_rank() const noexcept { return cross_rank; }
  /// Rank 0: the rank that writes checkpoints, metrics and the progress bar.
  bool is_chief() const noexcept { return rank == 0; }
};

/// `context.experimental`: Determined's data layer. `cache_train_dataset(id, version, shuffle,
/// skip_shuffle_at_epoch_end)` and `cache_validation_dataset(id, version, shuffle)` return a
/// decorator: called with a function that makes an unbatched `Dataset`, it returns the cached
/// records of that dataset, built once per `(id, version)` under the experiment config's
/// `data_layer.host_storage_path` (every trial, every resume and every experiment naming the same
/// id and version reads the same cache; concurrent builders wait on a lock, and a killed build
/// leaves no cache behind), shuffled with the trial seed, sharded by rank (training drops the
/// remainder so that every rank sees as many records), and checkpointed by position, so that a
/// resume continues exactly. Batch after caching; do not `repeat`.
/// \code
/// trial::DataLoader build_training_data_loader() override {
///   auto records = context.experimental.cache_train_dataset("mnist", "v1", true)(
///       [] { return loadstar::from_tensor_slices(images, labels); });
///   return trial::DataLoader(std::move(records).batch(context.get_per_slot_batch_size()));
/// }
/// \endcode
/// As in Determined, each decorator serves one dataset per trial, and a cached dataset is never
/// also passed to `wrap_dataset` (the cache shards it already): both are refused with
/// `ConfigError`.
class ExperimentalContext {
 public:
  ExperimentalContext() = default;
  /// The data layer of trial `trial_id` (for messages) as `config` says, streaming with
  /// `layer`'s seed, rank and batch size (its `storage_path` is `config`'s directory).
  ExperimentalContext(DataLayerConfig config, DataLayerOptions layer, std::uint64_t trial_id)
      : config_(std::move(config)), layer_(std::move(layer)), trial_id_(trial_id) {}

  /// Determined's `cache_train_dataset`: the cache `(dataset_id, dataset_version + "_train")`,
  /// streamed shuffled with the trial seed when `shuffle` (again each epoch unless
  /// `skip_shuffle_at_epoch_end`). `ConfigError` for a second call, a call after
  /// `wrap_dataset`, or an id or version that is not a plain name.
  DataLayer::Decorator cache_train_dataset(const std::string& dataset_id,
                                           const std::string& dataset_version, bool shuffle = false,
                                           bool skip_shuffle_at_epoch_end = false) {
    claim(train_used_, "cache_train_dataset");
    return DataLayer(options()).cache_train_dataset(dataset_id, dataset_version, shuffle,
                                                    skip_shuffle_at_epoch_end);
  }
  /// Determined's `cache_validation_dataset`: the cache `(dataset_id, dataset_version +
  /// "_val")`, all of it read by each validation (this rank's share), in one order.
  DataLayer::Decorator cache_validation_dataset(const std::string& dataset_id,
                                                const std::string& dataset_version,
                                                bool shuffle = false) {
    claim(validation_used_, "cache_validation_dataset");
    return DataLayer(options()).cache_validation_dataset(dataset_id, dataset_version, shuffle);
  }

  /// How many datasets the two decorators serve (0 to 2).
  std::size_t cached_datasets() const noexcept {
    return static_cast<std::size_t>(train_used_) + static_cast<std::size_t>(validation_used_);
  }
  /// Where the caches live (`ConfigError` when the config names no directory and neither
  /// `XDG_CACHE_HOME` nor `HOME` is set), the seed, the rank and the batch size they are streamed
  /// with.
  LOADSTAR_DECL DataLayerOptions options() const;

  /// Records a `wrap_dataset` call; `ConfigError` when a decorator was used.
  void note_wrapped_dataset() {
    if (cached_datasets() > 0) {
      throw ConfigError("trial " + std::to_string(trial_id_) +
                        ": wrap_dataset cannot be combined with context.experimental's "
                        "cache_train_dataset or cache_validation_dataset (the cache shards "
                        "the records by rank already)");
    }
    ++wrapped_;
  }
  std::size_t wrapped_datasets() const noexcept { return wrapped_; }

 private:
  void claim(bool& used, const char* name) {
    if (used) {
      throw ConfigError("trial " + std::to_string(trial_id_) + ": context.experimental." + name +
                        " can serve one dataset per trial but was called twice");
    }
    if (wrapped_ > 0) {
      throw ConfigError("trial " + std::to_string(trial_id_) + ": context.experimental." + name +
                        " cannot be combined with wrap_dataset (the cache shards the records by "
                        "rank already), but wrap_dataset was called");
    }
    used = true;
  }

  DataLayerConfig config_;
  DataLayerOptions layer_;
  std::uint64_t trial_id_ = 0;
  bool train_used_ = false;
  bool validation_used_ = false;
  std::size_t wrapped_ = 0;
};

/// The directory of the data layer's caches for `config`: `data_layer.host_storage_path`, else
/// `$XDG_CACHE_HOME/loadstar/data_layer`, else `$HOME/.cache/loadstar/data_layer`; `ConfigError`
/// when neither variable is set.
LOADSTAR_DECL std::filesystem::path data_layer_directory(const DataLayerConfig& config);

/// What a trial is given: Determined's `TrialContext` for a Keras trial.
/// \code
/// auto lr = context.get_hparam("learning_rate").get<double>();
/// context.configure_fit({.workers = 2, .shuffle = true});
/// \endcode
class TrialContext {
 public:
  /// A context for one trial on the ranks of `collective` (null: one process); throws
  /// `ConfigError` when `hparams` has no `global_batch_size` (an integer at least 1) or it is
  /// less than the number of ranks. Each rank's batch is `global_batch_size / ranks` (Determined's
  /// per-slot batch size).
  LOADSTAR_DECL TrialContext(ExperimentConfig config, nlohmann::json hparams,
                             std::uint64_t trial_id = 1, std::uint32_t trial_seed = 0,
                             std::uint64_t experiment_id = 1,
                             std::shared_ptr<dist::Collective> collective = nullptr);

  const nlohmann::json& get_hparams() const noexcept { return hparams_; }
  /// The hyperparameter `name`; throws `ConfigError` naming it and the known ones when missing.
  LOADSTAR_DECL const nlohmann::json& get_hparam(std::string_view name) const;
  std::uint64_t get_global_batch_size() const noexcept { return global_batch_size_; }
  std::uint64_t get_per_slot_batch_size() const noexcept { return per_slot_batch_size_; }
  const ExperimentConfig& get_experiment_config() const noexcept { return config_; }
  const nlohmann::json& get_data_config() const noexcept { return config_.data; }
  std::uint64_t get_trial_id() const noexcept { return trial_id_; }
  std::uint64_t get_experiment_id() const noexcept { return experiment_id_; }
  std::uint32_t get_trial_seed() const noexcept { return trial_seed_; }

  /// Records the model the runner trains (compiled by `build_model` itself) and returns it.
  LOADSTAR_DECL keras::Model& wrap_model(keras::Model& model);
  /// The model `wrap_model` recorded (null before).
  keras::Model* model() const noexcept { return model_; }

  /// Determined's `wrap_optimizer`: with several ranks, or an `optimizations.aggregation_frequency`
  /// above 1, `optimizer` wrapped in a `dist::DistributedOptimizer` (with the aggregation
  /// frequency, `average_aggregated_gradients` and `tensor_fusion_threshold`); else the optimizer
  /// itself. The runner wraps the compiled model's optimizer itself when the trial did not.
  LOADSTAR_DECL std::shared_ptr<keras::Optimizer> wrap_optimizer(
      std::shared_ptr<keras::Optimizer> optimizer);

  /// The collectives between the trial's ranks (a one-process collective without MPI).
  const std::shared_ptr<dist::Collective>& collective() const noexcept { return collective_; }

  /// Determined's `wrap_dataset`: this rank's shard of `dataset` (`dataset.shard(size, rank)`,
  /// so that the ranks partition every epoch) when the trial has several ranks and
  /// `shard_dataset`, else every element. Call it on a `Dataset` before batching it; a trial of
  /// several ranks whose `Dataset` loader was not wrapped is refused.
  template <Dataset D>
  ShardDataset<std::remove_cvref_t<D>> wrap_dataset(D&& dataset, bool shard_dataset = true) {
    experimental.note_wrapped_dataset();
    return loadstar::wrap_dataset(
        std::remove_cvref_t<D>(std::forward<D>(dataset)),
        loadstar::DistributedContext{static_cast<std::size_t>(distributed.rank),
                                     static_cast<std::size_t>(distributed.size)},
        shard_dataset);
  }
  /// How many datasets `wrap_dataset` has wrapped.
  std::size_t wrapped_datasets() const noexcept { return experimental.wrapped_datasets(); }

  /// The dtype policy the trial's layers and model take (`keras::mixed_precision`'s
  /// `"mixed_float16"`, `"mixed_bfloat16"`, ...): the runner builds the model under it, in this
  /// trial's thread only, as a Keras trial calls `mixed_precision.set_global_policy` in its
  /// constructor. Unset: the process's global policy.
  void set_global_policy(const keras::mixed_precision::Policy& policy) noexcept {
    dtype_policy_ = policy;
  }
  const std::optional<keras::mixed_precision::Policy>& dtype_policy() const noexcept {
    return dtype_policy_;
  }

  /// Determined's `configure_fit`: sets the given arguments, keeps the others.
  LOADSTAR_DECL void configure_fit(const FitConfig& config);
  const FitSettings& fit_settings() const noexcept { return fit_; }
  /// How the runner reads this rank's training and validation data: the per-slot batch size,
  /// the `configure_fit` workers, processes, queue size and shuffling, the trial seed, and this
  /// rank's shard.
  LOADSTAR_DECL keras::DataIteratorOptions data_options() const;

  /// Determined's stop request: finish the workload, checkpoint and exit.
  bool get_stop_requested() const noexcept { return stop_requested_; }
  void set_stop_requested(bool stop) noexcept { stop_requested_ = stop; }

  DistributedContext distributed;
  ExperimentalContext experimental;

 private:
  ExperimentConfig config_;
  std::optional<keras::mixed_precision::Policy> dtype_policy_;
  nlohmann::json hparams_;
  std::uint64_t trial_id_;
  std::uint64_t experiment_id_;
  std::uint32_t trial_seed_;
  std::shared_ptr<dist::Collective> collective_;
  std::uint64_t global_batch_size_ = 1;
  std::uint64_t per_slot_batch_size_ = 1;
  keras::Model* model_ = nullptr;
  FitSettings fit_;
  bool stop_requested_ = false;
};

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

TrialContext::TrialContext(ExperimentConfig config, nlohmann::json hparams, std::uint64_t trial_id,
                           std::uint32_t trial_seed, std::uint64_t experiment_id,
                           std::shared_ptr<dist::Collective> collective)
    : config_(std::move(config)),
      hparams_(std::move(hparams)),
      trial_id_(trial_id),
      experiment_id_(experiment_id),
      trial_seed_(trial_seed),
      collective_(collective ? std::move(collective) : std::make_shared<dist::LocalCollective>()) {
  distributed = {collective_->rank(), collective_->size(), collective_->local_rank(),
                 collective_->local_size(), collective_->cross_rank()};
  if (!hparams_.is_object()) {
    throw ConfigError("trial " + std::to_string(trial_id_) +
                      ": expected the hyperparameters as an object but found " +
                      loadstar::detail::shown(hparams_));
  }
  const auto found = hparams_.find("global_batch_size");
  if (found == hparams_.end() || !found->is_number_integer() || found->get<std::int64_t>() < 1) {
    throw ConfigError(
        "trial " + std::to_string(trial_id_) +
        ": hyperparameter 'global_batch_size' must be an integer at least 1 but " +
        (found == hparams_.end() ? std::string("is missing") : "is " + found->dump()));
  }
  global_batch_size_ = found->get<std::uint64_t>();
  const auto slots = static_cast<std::uint64_t>(distributed.size);
  if (global_batch_size_ < slots) {
    throw ConfigError("trial " + std::to_string(trial_id_) + ": global_batch_size " +
                      std::to_string(global_batch_size_) + " is less than the " +
                      std::to_string(slots) + " ranks of the trial");
  }
  per_slot_batch_size_ = global_batch_size_ / slots;
  experimental = ExperimentalContext(
      config_.data_layer,
      DataLayerOptions{.storage_path = {},
                       .seed = trial_seed_,
                       .distributed = {static_cast<std::size_t>(distributed.rank),
                                       static_cast<std::size_t>(distributed.size)},
                       .per_slot_batch_size = static_cast<std::size_t>(per_slot_batch_size_),
                       .batches_trained = 0},
      trial_id_);
}

DataLayerOptions ExperimentalContext::options() const {
  DataLayerOptions options = layer_;
  options.storage_path = data_layer_directory(config_);
  return options;
}

std::filesystem::path data_layer_directory(const DataLayerConfig& config) {
  if (!config.host_storage_path.empty()) return config.host_storage_path;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache == '/') {
    return std::filesystem::path(cache) / "loadstar" / "data_layer";
  }
  if (const char* home = std::getenv("HOME"); home && *home == '/') {
    return std::filesystem::path(home) / ".cache" / "loadstar" / "data_layer";
  }
  throw ConfigError(
      "data_layer: expected host_storage_path, or HOME or XDG_CACHE_HOME set to an absolute "
      "path for the default cache directory, but none is");
}

const nlohmann::json& TrialContext::get_hparam(std::string_view name) const {
  const auto found = hparams_.find(std::string(name));
  if (found == hparams_.end()) {
    std::string known;
    for (const auto& [key, value] : hparams_.items())
      known += (known.empty() ? "" : ", ") + key;
    throw ConfigError("trial " + std::to_string(trial_id_) + ": no hyperparameter '" +
                      std::string(name) + "' (the hyperparameters are " + known + ")");
  }
  return *found;
}

keras::Model& TrialContext::wrap_model(keras::Model& model) {
  model_ = &model;
  return model;
}

std::shared_ptr<keras::Optimizer> TrialContext::wrap_optimizer(
    std::shared_ptr<keras::Optimizer> optimizer) {
  if ((distributed.size == 1 && config_.aggregation_frequency == 1) ||
      dynamic_cast<dist::DistributedOptimizer*>(optimizer.get())) {
    return optimizer;
  }
  return std::make_shared<dist::DistributedOptimizer>(
      std::move(optimizer), collective_,
      dist::DistributedOptions{
          .fusion_threshold_bytes = static_cast<std::size_t>(config_.tensor_fusion_threshold)
                                    << 20U,
          .aggregation_frequency = static_cast<std::size_t>(config_.aggregation_frequency),
          .average_aggregated_gradients = config_.average_aggregated_gradients});
}

keras::DataIteratorOptions TrialContext::data_options() const {
  return {.batch_size = static_cast<std::size_t>(per_slot_batch_size_),
          .use_multiprocessing = fit_.use_multiprocessing,
          .adapter = {.max_queue_size = fit_.max_queue_size,
                      .workers = fit_.workers,
                      .sampler = {.shuffle = fit_.shuffle,
                                  .seed = trial_seed_,
                                  .rank = static_cast<std::size_t>(distributed.rank),
                                  .size = static_cast<std::size_t>(distributed.size)}}};
}

void TrialContext::configure_fit(const FitConfig& config) {
  if (config.verbose) fit_.verbose = *config.verbose;
  if (config.class_weight) fit_.class_weight = *config.class_weight;
  if (config.workers) fit_.workers = *config.workers;
  if (config.use_multiprocessing) fit_.use_multiprocessing = *config.use_multiprocessing;
  if (config.max_queue_size) {
    if (*config.max_queue_size == 0) {
      throw ConfigError("trial " + std::to_string(trial_id_) +
                        ": configure_fit: max_queue_size must be positive but is 0");
    }
    fit_.max_queue_size = *config.max_queue_size;
  }
  if (config.validation_freq && *config.validation_freq != 1) {
    throw ConfigError("trial " + std::to_string(trial_id_) +
                      ": configure_fit: validation_freq must be 1 but is " +
                      std::to_string(*config.validation_freq) +
                      ": validations in a trial follow min_validation_period and the searcher "
                      "(Determined's configure_fit has no validation_freq)");
  }
  if (config.shuffle) {
    fit_.shuffle = *config.shuffle;
    fit_.shuffle_given = true;
  }
  if (config.validation_steps) fit_.validation_steps = *config.validation_steps;
}

}  // namespace loadstar::trial
#endif
