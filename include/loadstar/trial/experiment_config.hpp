/// \file
/// `ExperimentConfig`: Determined's experiment configuration for a Keras trial, as plain data
/// (the fields and defaults of Determined 0.15's schemas).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loadstar::trial {

/// The unit of a `Length`.
enum class Unit { batches, records, epochs };

/// A training length, `{batches: N}`, `{records: N}` or `{epochs: N}`; 0 disables a period.
struct Length {
  Unit unit = Unit::batches;
  std::uint64_t value = 0;

  friend bool operator==(const Length&, const Length&) = default;
};

struct NamedHyperparameter;

/// One entry of `hyperparameters`: a constant, a range to search or a nested group.
struct Hyperparameter {
  enum class Type { constant, integer, real, log, categorical, nested };
  Type type = Type::constant;
  /// `const`: the value (a scalar in the file is a `const`).
  nlohmann::json val;
  /// `int`, `double` and `log`: the range (for `log`, of the exponent).
  double minval = 0;
  double maxval = 0;
  /// `log`: the base of the exponent.
  double base = 10;
  /// `int`, `double` and `log`: the number of grid points (required by the grid searcher).
  std::optional<std::uint64_t> count;
  /// `categorical`: the values.
  std::vector<nlohmann::json> vals;
  /// A nested group (a mapping without `type`): its members in file order.
  std::vector<NamedHyperparameter> members;
};

struct NamedHyperparameter {
  std::string name;
  Hyperparameter value;
};

/// `searcher`.
struct SearcherConfig {
  /// `single`, `grid`, `random` or `adaptive_asha`.
  std::string name = "single";
  /// The validation metric the searcher ranks by (`val_loss`, `val_accuracy`).
  std::string metric;
  bool smaller_is_better = true;
  Length max_length;
  /// `random` and `adaptive_asha`.
  std::uint64_t max_trials = 0;
  /// 0: Determined's automatic choice.
  std::uint64_t max_concurrent_trials = 0;
  /// `adaptive_asha`: `aggressive`, `standard` or `conservative`.
  std::string mode = "standard";
  double divisor = 4;
  std::uint64_t max_rungs = 5;
  std::vector<std::uint64_t> bracket_rungs;
  bool stop_once = false;
  std::optional<std::uint64_t> source_trial_id;
  std::optional<std::string> source_checkpoint_uuid;
};

enum class CheckpointPolicy { best, all, none };

/// `checkpoint_storage` (type `shared_fs` only).
struct CheckpointStorage {
  std::string type = "shared_fs";
  /// Empty: the experiment's own folder.
  std::string host_path;
  std::string storage_path;
  std::uint64_t save_experiment_best = 0;
  std::uint64_t save_trial_best = 1;
  std::uint64_t save_trial_latest = 1;
};

/// An experiment configuration, with Determined's defaults for what the file leaves out.
struct ExperimentConfig {
  std::string description;
  std::vector<std::string> labels;
  /// The registered name of the trial class (`model_def:FashionMNISTTrial`).
  std::string entrypoint;
  /// In file order.
  std::vector<NamedHyperparameter> hyperparameters;
  SearcherConfig searcher;
  /// 0: unset (then no length may be in epochs).
  std::uint64_t records_per_epoch = 0;
  std::uint64_t scheduling_unit = 100;
  Length min_validation_period;
  Length min_checkpoint_period;
  bool perform_initial_validation = false;
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  CheckpointStorage checkpoint_storage;
  /// `reproducibility.experiment_seed`; unset: chosen when the experiment is created.
  std::optional<std::uint32_t> experiment_seed;
  std::uint64_t max_restarts = 5;
  /// `resources.slots_per_trial`.
  std::uint64_t slots_per_trial = 1;
  /// `optimizations.aggregation_frequency`.
  std::uint64_t aggregation_frequency = 1;
  /// `optimizations.average_training_metrics`.
  bool average_training_metrics = false;
  /// `data`, free-form.
  nlohmann::json data = nlohmann::json::object();
  /// The whole configuration as given, as JSON (what `get_experiment_config()` returns).
  nlohmann::json raw = nlohmann::json::object();
};

}  // namespace loadstar::trial
