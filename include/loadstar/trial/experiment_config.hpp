/// \file
/// `ExperimentConfig`: Determined's experiment configuration for a Keras trial, as plain data
/// (the fields and defaults of Determined 0.15's schemas), read from YAML
/// (`load_experiment_config`, `parse_experiment_config`) or JSON (`experiment_config_from_json`),
/// written as JSON (`to_json`), and turned into Determined's `--test` config (`make_test_config`).
/// \code
/// const ExperimentConfig config = load_experiment_config("const.yaml");
/// const nlohmann::json stored = to_json(config);  // what an experiment keeps
/// assert(experiment_config_from_json(stored, "experiment.json") == config);
/// \endcode
///
/// Over 800 lines as one schema: every key's check sits beside its field and default; the
/// bodies, most of the file, are compiled into loadstar_trial under LOADSTAR_SEPARATE_COMPILATION.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/detail/strings.hpp"
#include "loadstar/error.hpp"
#include "loadstar/trial/detail/suggest.hpp"
#include "loadstar/trial/detail/yaml_json.hpp"

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
  /// A nested group (a mapping without `type`): its members, sorted by name.
  std::vector<NamedHyperparameter> members;

  // Defined below, where NamedHyperparameter is complete (written out: clang 14 crashes on a
  // defaulted comparison of this recursive type).
  friend bool operator==(const Hyperparameter&, const Hyperparameter&);
};

struct NamedHyperparameter {
  std::string name;
  Hyperparameter value;

  friend bool operator==(const NamedHyperparameter& a, const NamedHyperparameter& b) {
    return a.name == b.name && a.value == b.value;
  }
};

LOADSTAR_DECL bool operator==(const Hyperparameter& a, const Hyperparameter& b);

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

  friend bool operator==(const SearcherConfig&, const SearcherConfig&) = default;
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

  friend bool operator==(const CheckpointStorage&, const CheckpointStorage&) = default;
};

/// `data_layer` (Determined's data layer, type `shared_fs` only): where
/// `context.experimental.cache_train_dataset` and `cache_validation_dataset` keep their caches.
struct DataLayerConfig {
  std::string type = "shared_fs";
  /// An absolute directory; empty: `$XDG_CACHE_HOME/loadstar/data_layer` (or
  /// `~/.cache/loadstar/data_layer`), shared by every experiment of the user.
  std::string host_storage_path;

  friend bool operator==(const DataLayerConfig&, const DataLayerConfig&) = default;
};

/// An experiment configuration, with Determined's defaults for what the file leaves out.
struct ExperimentConfig {
  /// `name`: shown by `experiment list` and `experiment describe`.
  std::string name;
  std::string description;
  std::vector<std::string> labels;
  /// The registered name of the trial class (`model_def:FashionMNISTTrial`).
  std::string entrypoint;
  /// Sorted by name (a mapping in the file, visited sorted as Determined's `Each` visits it).
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
  /// `resources.max_slots`: the most slots the experiment's trials hold at once (0: unset), so at
  /// most `max_slots / slots_per_trial` trials run at once.
  std::uint64_t max_slots = 0;
  /// `optimizations.aggregation_frequency`.
  std::uint64_t aggregation_frequency = 1;
  /// `optimizations.average_training_metrics`.
  bool average_training_metrics = false;
  /// `optimizations.average_aggregated_gradients`: with `aggregation_frequency` above 1, the
  /// step takes the mean of the aggregated batches' gradients (else their sum).
  bool average_aggregated_gradients = true;
  /// `optimizations.tensor_fusion_threshold`, in MB: the most gradient bytes one allreduce sums
  /// (0: one allreduce per variable).
  std::uint64_t tensor_fusion_threshold = 64;
  /// `data_layer`.
  DataLayerConfig data_layer;
  /// `environment.environment_variables`: `KEY=VALUE`, set in each trial's process before its
  /// trial is built (the rest of `environment` describes containers, which trials here do not
  /// run in).
  std::vector<std::string> environment_variables;
  /// `data`, free-form.
  nlohmann::json data = nlohmann::json::object();
  /// The whole configuration as JSON with Determined's defaults filled in, as Determined's master
  /// hands it to a trial (what `get_experiment_config()` returns): `to_json(*this)` once parsed.
  /// Keys of Determined's cluster settings given with their default values (`bind_mounts: []`,
  /// `environment.image` unset) are kept here as given.
  nlohmann::json raw = nlohmann::json::object();

  /// Every field equal, `raw` included: `experiment_config_from_json(to_json(c), …) == c` for a
  /// parsed `c`.
  friend bool operator==(const ExperimentConfig&, const ExperimentConfig&) = default;
};

/// The reading and writing of experiment configs (its own namespace, so that its helpers and
/// its `json` alias stay clear of the other trial headers' `detail` code).
/// `"batches"`, `"records"` or `"epochs"`.
LOADSTAR_DECL std::string to_string(Unit unit);

/// `{"batches": 5}`: a length as Determined writes it.
inline nlohmann::json length_to_json(const Length& length) {
  return nlohmann::json{{to_string(length.unit), length.value}};
}

namespace detail::expconf {

using json = nlohmann::json;

/// A key of Determined's cluster settings (containers, agents, the scheduler) that has no
/// counterpart for trials run as processes of one machine: its Determined default (`value`; null
/// where Determined has none) is what this machine does anyway, so that value, or null, is taken;
/// any other is refused with `reason`. The README's experiment config section lists every key.
struct DefaultOnlyKey {
  std::string key;
  nlohmann::json value;
  std::string reason;
};

LOADSTAR_DECL const std::vector<DefaultOnlyKey>& default_only_top_level_keys();

LOADSTAR_DECL const std::vector<DefaultOnlyKey>& default_only_resources_keys();

LOADSTAR_DECL const std::vector<DefaultOnlyKey>& default_only_environment_keys();

LOADSTAR_DECL const std::vector<DefaultOnlyKey>& default_only_storage_keys();

LOADSTAR_DECL std::string checkpoint_policy_key(CheckpointPolicy policy);

inline json length_config_json(const Length& length) {
  return length_to_json(length);
}

/// The keys a searcher takes, by its name (Determined's per-searcher schemas refuse the others).
LOADSTAR_DECL std::vector<std::string> searcher_config_keys(const std::string& name);

/// "a, b or c".
LOADSTAR_DECL std::string one_of_text(const std::vector<std::string>& options);

/// Reads one experiment config given as JSON, with messages that name the config, the key path,
/// the expectation and the finding (shown in YAML's flow style, as the user wrote it).
class ExperimentConfigReader {
 public:
  explicit ExperimentConfigReader(std::string_view source)
      : where_("experiment config '" + std::string(source) + "'") {}

  const std::string& where() const { return where_; }

  [[noreturn]] LOADSTAR_DECL void fail(const std::string& path, const std::string& message) const;

  [[noreturn]] void refuse(const std::string& path, const std::string& expected, const json& found,
                           const std::string& suffix = "") const {
    fail(path, "expected " + expected + " but found " + to_flow(found) + suffix);
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  /// Refuses `value` unless it is a mapping, any key of it that is in neither `keys` nor
  /// `defaults_only`, and a key of `defaults_only` whose value is neither null nor the default.
  LOADSTAR_DECL void check_keys(const json& value, const std::string& path, const std::string& what,
                                const std::vector<std::string>& keys,
                                const std::vector<DefaultOnlyKey>& defaults_only = {}) const;

  LOADSTAR_DECL static const json* find(const json& object, const std::string& key);

  /// `object[key]`, refused when missing.
  LOADSTAR_DECL const json& required(const json& object, const std::string& key,
                                     const std::string& path, const std::string& expected) const;

  LOADSTAR_DECL std::uint64_t to_uint(const json& value, const std::string& path, std::uint64_t min,
                                      std::uint64_t max = UINT64_MAX) const;

  LOADSTAR_DECL std::int64_t to_int(const json& value, const std::string& path) const;

  LOADSTAR_DECL double to_number(const json& value, const std::string& path) const;

  LOADSTAR_DECL bool to_bool(const json& value, const std::string& path) const;

  LOADSTAR_DECL std::string to_string(const json& value, const std::string& path) const;

  LOADSTAR_DECL std::string to_choice(const json& value, const std::string& path,
                                      const std::vector<std::string>& options) const;

  LOADSTAR_DECL Length to_length(const json& value, const std::string& path, bool positive) const;

  /// Hyperparameters are named by their dotted path (`optimizer.learning_rate`), so a name may
  /// hold no '.' and may not be empty.
  LOADSTAR_DECL void check_hparam_name(const std::string& name, const std::string& path) const;

  LOADSTAR_DECL Hyperparameter to_hyperparameter(const json& value, const std::string& path) const;

  /// Determined's `check-global-batch-size`: an int hyperparameter >= 1 (a const, an int range or
  /// a categorical of ints). Returns its smallest value.
  LOADSTAR_DECL std::uint64_t check_global_batch_size(
      const json& hparams, const std::vector<NamedHyperparameter>& parsed) const;

  LOADSTAR_DECL ExperimentConfig read(const json& root) const;

  LOADSTAR_DECL SearcherConfig read_searcher(const json& value) const;

  LOADSTAR_DECL CheckpointStorage read_storage(const json& value) const;

  /// `data_layer`: type `shared_fs` with an absolute `host_storage_path` (or none); S3, GCS and
  /// `container_storage_path` (trials run on this host, not in containers) are refused.
  LOADSTAR_DECL DataLayerConfig read_data_layer(const json& value) const;

  /// `environment.environment_variables` (a list of `KEY=VALUE`); Determined's per-slot-type
  /// mapping is refused, and the container keys are taken only with their defaults.
  LOADSTAR_DECL std::vector<std::string> read_environment(const json& value) const;

  /// `optimizations` into `config`: refuses what has no effect here (compression, mixed
  /// precision other than O0, Horovod's timing and tuning knobs other than their defaults).
  LOADSTAR_DECL void read_optimizations(const json& value, ExperimentConfig& config) const;

 private:
  std::string where_;
};

LOADSTAR_DECL json hyperparameter_config_json(const Hyperparameter& hp);

/// `section` of `raw` without the keys that `to_json` writes (keeping the default-only ones).
LOADSTAR_DECL json kept_config_section(const json& raw, const std::string& section,
                                       std::initializer_list<const char*> written);

}  // namespace detail::expconf

/// The config as JSON, every field written out with its value (Determined's defaults included),
/// in Determined's schema: what an experiment stores and what `experiment_config_from_json` reads
/// back to an equal config. Keys of `raw` that no field holds (`environment`) are kept.
LOADSTAR_DECL nlohmann::json to_json(const ExperimentConfig& config);

/// Reads a config given as JSON (an experiment's stored config, or a file's parsed YAML); `source`
/// names it in messages. `ConfigError` for an unknown key (with a suggestion for a misspelt one),
/// a value of the wrong type or out of range, a missing required key, a `global_batch_size` that
/// is not an int hyperparameter >= 1, a length in epochs without `records_per_epoch`, or a
/// `checkpoint_storage.type` other than `shared_fs`; each message names the key path, what was
/// expected and what was found. `raw` is `to_json` of the result.
LOADSTAR_DECL ExperimentConfig experiment_config_from_json(const nlohmann::json& config,
                                                           std::string_view source);

/// Parses an experiment config from YAML text (Determined's fields and defaults for a Keras
/// trial); `source` names it in messages (a file name). The refusals of
/// `experiment_config_from_json`, plus text that is not YAML (with its line and column) and a key
/// given twice.
/// \code
/// const ExperimentConfig config = parse_experiment_config(R"(
/// entrypoint: model_def:FashionMNISTTrial
/// hyperparameters: {global_batch_size: 32, learning_rate: {type: log, minval: -4, maxval: -1}}
/// searcher: {name: single, metric: val_accuracy, smaller_is_better: false,
///            max_length: {epochs: 5}}
/// records_per_epoch: 60000
/// )", "const.yaml");
/// \endcode
LOADSTAR_DECL ExperimentConfig parse_experiment_config(std::string_view yaml,
                                                       std::string_view source);

/// Reads and parses the YAML file `path` (named in messages as given); `IoError` when it cannot
/// be read.
LOADSTAR_DECL ExperimentConfig load_experiment_config(const std::filesystem::path& path);

/// Determined's `--test` overrides (`make_test_experiment_config`): one-batch workloads, a
/// validation after every batch, the `single` searcher for one batch, no restarts, and only the
/// latest checkpoint kept (Determined keeps none; here the one checkpoint `--test` writes stays
/// for inspection). The description gets Determined's `[test-mode] ` prefix.
LOADSTAR_DECL ExperimentConfig make_test_config(ExperimentConfig config);

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

bool operator==(const Hyperparameter& a, const Hyperparameter& b) {
  return a.type == b.type && a.val == b.val && a.minval == b.minval && a.maxval == b.maxval &&
         a.base == b.base && a.count == b.count && a.vals == b.vals && a.members == b.members;
}

std::string to_string(Unit unit) {
  switch (unit) {
    case Unit::batches:
      return "batches";
    case Unit::records:
      return "records";
    case Unit::epochs:
      return "epochs";
  }
  return "unknown";
}

nlohmann::json to_json(const ExperimentConfig& config) {
  using nlohmann::json;
  json out = config.raw.is_object() ? config.raw : json::object();
  if (!config.name.empty()) out["name"] = config.name;
  out["description"] = config.description;
  out["labels"] = config.labels;
  out["entrypoint"] = config.entrypoint;
  json hparams = json::object();
  for (const auto& hp : config.hyperparameters) {
    hparams[hp.name] = detail::expconf::hyperparameter_config_json(hp.value);
  }
  out["hyperparameters"] = hparams;
  const SearcherConfig& s = config.searcher;
  json searcher{{"name", s.name},
                {"metric", s.metric},
                {"smaller_is_better", s.smaller_is_better},
                {"max_length", detail::expconf::length_config_json(s.max_length)}};
  const auto keys = detail::expconf::searcher_config_keys(s.name);
  const auto takes = [&](const char* key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  if (takes("max_concurrent_trials")) searcher["max_concurrent_trials"] = s.max_concurrent_trials;
  if (takes("max_trials")) searcher["max_trials"] = s.max_trials;
  if (takes("mode")) {
    searcher["mode"] = s.mode;
    searcher["divisor"] = s.divisor;
    searcher["max_rungs"] = s.max_rungs;
    searcher["bracket_rungs"] = s.bracket_rungs;
    searcher["stop_once"] = s.stop_once;
  }
  if (s.source_trial_id) searcher["source_trial_id"] = *s.source_trial_id;
  if (s.source_checkpoint_uuid) searcher["source_checkpoint_uuid"] = *s.source_checkpoint_uuid;
  out["searcher"] = searcher;
  out["records_per_epoch"] = config.records_per_epoch;
  out["scheduling_unit"] = config.scheduling_unit;
  out["min_validation_period"] = detail::expconf::length_config_json(config.min_validation_period);
  out["min_checkpoint_period"] = detail::expconf::length_config_json(config.min_checkpoint_period);
  out["perform_initial_validation"] = config.perform_initial_validation;
  out["checkpoint_policy"] = detail::expconf::checkpoint_policy_key(config.checkpoint_policy);
  json storage = detail::expconf::kept_config_section(
      config.raw, "checkpoint_storage",
      {"type", "host_path", "storage_path", "save_experiment_best", "save_trial_best",
       "save_trial_latest"});
  const CheckpointStorage& cs = config.checkpoint_storage;
  storage["type"] = cs.type;
  if (!cs.host_path.empty()) storage["host_path"] = cs.host_path;
  if (!cs.storage_path.empty()) storage["storage_path"] = cs.storage_path;
  storage["save_experiment_best"] = cs.save_experiment_best;
  storage["save_trial_best"] = cs.save_trial_best;
  storage["save_trial_latest"] = cs.save_trial_latest;
  out["checkpoint_storage"] = storage;
  json reproducibility = json::object();
  if (config.experiment_seed) reproducibility["experiment_seed"] = *config.experiment_seed;
  out["reproducibility"] = reproducibility;
  out["max_restarts"] = config.max_restarts;
  json resources = detail::expconf::kept_config_section(config.raw, "resources",
                                                        {"slots_per_trial", "max_slots"});
  resources["slots_per_trial"] = config.slots_per_trial;
  if (config.max_slots > 0) resources["max_slots"] = config.max_slots;
  out["resources"] = resources;
  json optimizations = detail::expconf::kept_config_section(
      config.raw, "optimizations",
      {"aggregation_frequency", "average_training_metrics", "average_aggregated_gradients",
       "tensor_fusion_threshold"});
  optimizations["aggregation_frequency"] = config.aggregation_frequency;
  optimizations["average_training_metrics"] = config.average_training_metrics;
  optimizations["average_aggregated_gradients"] = config.average_aggregated_gradients;
  optimizations["tensor_fusion_threshold"] = config.tensor_fusion_threshold;
  out["optimizations"] = optimizations;
  json data_layer{{"type", config.data_layer.type}};
  if (!config.data_layer.host_storage_path.empty()) {
    data_layer["host_storage_path"] = config.data_layer.host_storage_path;
  }
  out["data_layer"] = data_layer;
  if (!config.environment_variables.empty()) {
    if (!out.contains("environment") || !out["environment"].is_object()) {
      out["environment"] = json::object();
    }
    out["environment"]["environment_variables"] = config.environment_variables;
  }
  out["data"] = config.data;
  return out;
}

ExperimentConfig experiment_config_from_json(const nlohmann::json& config,
                                             std::string_view source) {
  // JSON built in C++ may hold any bytes; the config is shown and stored as JSON text.
  try {
    loadstar::detail::check_json_text(config, "text");
  } catch (const FormatError& e) {
    throw ConfigError("experiment config '" + loadstar::detail::shown_text(source) +
                      "': " + e.what());
  }
  ExperimentConfig parsed = detail::expconf::ExperimentConfigReader(source).read(config);
  parsed.raw = to_json(parsed);
  return parsed;
}

ExperimentConfig parse_experiment_config(std::string_view yaml, std::string_view source) {
  const std::string where = "experiment config '" + std::string(source) + "'";
  return experiment_config_from_json(detail::parse_yaml(yaml, where), source);
}

ExperimentConfig load_experiment_config(const std::filesystem::path& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw IoError("experiment config '" + path.string() +
                  "': expected a YAML file but found a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    throw IoError("experiment config '" + path.string() + "': cannot open for reading: " +
                  (error != 0 ? std::strerror(error) : "unknown error"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw IoError("experiment config '" + path.string() + "': cannot read");
  return parse_experiment_config(text.str(), path.string());
}

ExperimentConfig make_test_config(ExperimentConfig config) {
  const std::string prefix = "[test-mode] ";
  if (config.description.rfind(prefix, 0) != 0) config.description = prefix + config.description;
  config.scheduling_unit = 1;
  config.min_validation_period = Length{Unit::batches, 1};
  SearcherConfig searcher;
  searcher.name = "single";
  searcher.metric = config.searcher.metric;
  searcher.smaller_is_better = config.searcher.smaller_is_better;
  searcher.max_length = Length{Unit::batches, 1};
  config.searcher = searcher;
  config.checkpoint_storage.save_experiment_best = 0;
  config.checkpoint_storage.save_trial_best = 0;
  config.checkpoint_storage.save_trial_latest = 1;
  config.max_restarts = 0;
  config.raw = to_json(config);
  return config;
}

}  // namespace loadstar::trial
namespace loadstar::trial::detail::expconf {

const std::vector<DefaultOnlyKey>& default_only_top_level_keys() {
  static const std::vector<DefaultOnlyKey> keys{
      {"debug", false,
       "loadstar has no debug mode; each trial's whole output is in its output.log either way"},
      {"bind_mounts", json::array(),
       "trials run as processes of this machine and read its files where they are, without "
       "containers to mount them into"}};
  return keys;
}

const std::vector<DefaultOnlyKey>& default_only_resources_keys() {
  const std::string no_agents = "one machine runs every trial here; there are no agents to choose";
  const std::string no_scheduler =
      "loadstar runs one experiment per command, with no cluster scheduler to order experiments";
  const std::string no_containers =
      "trials run as processes of this machine, not in containers, and see all of its devices "
      "and memory";
  static const std::vector<DefaultOnlyKey> keys{
      {"agent_label", "", no_agents},
      {"resource_pool", "", no_agents},
      {"native_parallel", false,
       "loadstar itself launches a trial's ranks (over mpirun when slots_per_trial > 1)"},
      {"priority", nullptr, no_scheduler},
      {"weight", 1, no_scheduler},
      {"devices", json::array(), no_containers},
      {"shm_size", nullptr, no_containers}};
  return keys;
}

const std::vector<DefaultOnlyKey>& default_only_environment_keys() {
  const std::string reason = "trials run as processes of this machine, not in containers";
  static const std::vector<DefaultOnlyKey> keys{{"image", nullptr, reason},
                                                {"force_pull_image", false, reason},
                                                {"registry_auth", nullptr, reason},
                                                {"pod_spec", nullptr, reason},
                                                {"add_capabilities", json::array(), reason},
                                                {"drop_capabilities", json::array(), reason},
                                                {"ports", json::object(), reason},
                                                {"proxy_ports", json::array(), reason}};
  return keys;
}

const std::vector<DefaultOnlyKey>& default_only_storage_keys() {
  static const std::vector<DefaultOnlyKey> keys{
      {"propagation", "rprivate",
       "it sets the mount propagation of the storage inside a trial's container, and trials here "
       "run without containers"}};
  return keys;
}

std::string checkpoint_policy_key(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::best:
      return "best";
    case CheckpointPolicy::all:
      return "all";
    case CheckpointPolicy::none:
      return "none";
  }
  return "best";
}

std::vector<std::string> searcher_config_keys(const std::string& name) {
  std::vector<std::string> keys{"name",       "metric",          "smaller_is_better",
                                "max_length", "source_trial_id", "source_checkpoint_uuid"};
  if (name == "grid" || name == "random" || name == "adaptive_asha") {
    keys.emplace_back("max_concurrent_trials");
  }
  if (name == "random" || name == "adaptive_asha") keys.emplace_back("max_trials");
  if (name == "adaptive_asha") {
    for (const char* key : {"mode", "divisor", "max_rungs", "bracket_rungs", "stop_once"}) {
      keys.emplace_back(key);
    }
  }
  return keys;
}

std::string one_of_text(const std::vector<std::string>& options) {
  std::string out;
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (i > 0) out += i + 1 == options.size() ? " or " : ", ";
    out += options[i];
  }
  return out;
}

void ExperimentConfigReader::fail(const std::string& path, const std::string& message) const {
  throw ConfigError(where_ + ": " + path + ": " + message);
}

void ExperimentConfigReader::check_keys(const json& value, const std::string& path,
                                        const std::string& what,
                                        const std::vector<std::string>& keys,
                                        const std::vector<DefaultOnlyKey>& defaults_only) const {
  if (!value.is_object()) refuse(path.empty() ? "the top level" : path, "a mapping", value);
  for (const auto& entry : value.items()) {
    const std::string& key = entry.key();
    const json& item = entry.value();
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    const auto known = std::find_if(defaults_only.begin(), defaults_only.end(),
                                    [&](const DefaultOnlyKey& k) { return k.key == key; });
    if (known != defaults_only.end()) {
      if (item.is_null() || item == known->value) continue;
      refuse(join(path, key),
             known->value.is_null() ? std::string("no such key")
                                    : to_flow(known->value) + " (Determined's default)",
             item, ": " + known->reason);
    }
    std::vector<std::string> all = keys;
    for (const auto& k : defaults_only)
      all.push_back(k.key);
    fail(join(path, key), "not a key of " + what + did_you_mean(key, all));
  }
}

const json* ExperimentConfigReader::find(const json& object, const std::string& key) {
  const auto found = object.find(key);
  if (found == object.end()) return nullptr;
  return &*found;
}

const json& ExperimentConfigReader::required(const json& object, const std::string& key,
                                             const std::string& path,
                                             const std::string& expected) const {
  const json* found = find(object, key);
  if (found == nullptr) fail(join(path, key), "expected " + expected + " but it is missing");
  return *found;
}

std::uint64_t ExperimentConfigReader::to_uint(const json& value, const std::string& path,
                                              std::uint64_t min, std::uint64_t max) const {
  const std::string range =
      max == UINT64_MAX ? "an int >= " + std::to_string(min)
                        : "an int in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (value.is_number_unsigned()) {
    const auto x = value.get<std::uint64_t>();
    if (x >= min && x <= max) return x;
  } else if (value.is_number_integer()) {
    const auto x = value.get<std::int64_t>();
    if (x >= 0 && static_cast<std::uint64_t>(x) >= min && static_cast<std::uint64_t>(x) <= max) {
      return static_cast<std::uint64_t>(x);
    }
  }
  refuse(path, range, value);
}

std::int64_t ExperimentConfigReader::to_int(const json& value, const std::string& path) const {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<std::int64_t>();
  if (value.is_number_unsigned() &&
      value.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
    return static_cast<std::int64_t>(value.get<std::uint64_t>());
  }
  refuse(path, "an int", value);
}

double ExperimentConfigReader::to_number(const json& value, const std::string& path) const {
  if (!value.is_number()) refuse(path, "a number", value);
  const double x = value.get<double>();
  if (!std::isfinite(x)) refuse(path, "a finite number", value);
  return x;
}

bool ExperimentConfigReader::to_bool(const json& value, const std::string& path) const {
  if (!value.is_boolean()) refuse(path, "true or false", value);
  return value.get<bool>();
}

std::string ExperimentConfigReader::to_string(const json& value, const std::string& path) const {
  if (!value.is_string()) refuse(path, "a string", value);
  return value.get<std::string>();
}

std::string ExperimentConfigReader::to_choice(const json& value, const std::string& path,
                                              const std::vector<std::string>& options) const {
  std::vector<std::string> quoted;
  for (const auto& option : options)
    quoted.push_back(option);
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (std::find(options.begin(), options.end(), text) != options.end()) return text;
    refuse(path, "one of " + one_of_text(quoted), value, did_you_mean(text, options));
  }
  refuse(path, "one of " + one_of_text(quoted), value);
}

Length ExperimentConfigReader::to_length(const json& value, const std::string& path,
                                         bool positive) const {
  static const std::vector<std::string> units{"batches", "records", "epochs"};
  const std::string expected = "exactly one of batches, records or epochs";
  if (!value.is_object() || value.size() != 1) refuse(path, expected, value);
  const std::string key = value.begin().key();
  const json& amount = value.begin().value();
  Length length;
  if (key == "batches") {
    length.unit = Unit::batches;
  } else if (key == "records") {
    length.unit = Unit::records;
  } else if (key == "epochs") {
    length.unit = Unit::epochs;
  } else {
    refuse(path, expected, value, did_you_mean(key, units));
  }
  length.value = to_uint(amount, join(path, key), positive ? 1 : 0);
  return length;
}

void ExperimentConfigReader::check_hparam_name(const std::string& name,
                                               const std::string& path) const {
  if (name.empty()) fail(path, "expected non-empty hyperparameter names but found ''");
  if (name.find('.') != std::string::npos) {
    fail(join(path, name), "expected a hyperparameter name without '.' but found '" + name + "'");
  }
}

Hyperparameter ExperimentConfigReader::to_hyperparameter(const json& value,
                                                         const std::string& path) const {
  using Type = Hyperparameter::Type;
  Hyperparameter hp;
  if (!value.is_object()) {
    // A scalar or a list is a const (Determined's shorthand).
    hp.type = Type::constant;
    hp.val = value;
    return hp;
  }
  const json* type = find(value, "type");
  if (type == nullptr) {
    if (value.empty()) refuse(path, "a hyperparameter or a group of them", value);
    hp.type = Type::nested;
    for (const auto& [name, member] : value.items()) {
      check_hparam_name(name, path);
      hp.members.push_back({name, to_hyperparameter(member, join(path, name))});
    }
    return hp;
  }
  const std::string kind =
      to_choice(*type, join(path, "type"), {"const", "int", "double", "log", "categorical"});
  if (kind == "const") {
    check_keys(value, path, "a const hyperparameter", {"type", "val"});
    hp.type = Type::constant;
    hp.val = required(value, "val", path, "the constant's value");
    return hp;
  }
  if (kind == "categorical") {
    check_keys(value, path, "a categorical hyperparameter", {"type", "vals"});
    hp.type = Type::categorical;
    const json& vals = required(value, "vals", path, "a non-empty list of values");
    if (!vals.is_array() || vals.empty()) {
      refuse(join(path, "vals"), "a non-empty list of values", vals);
    }
    hp.vals.assign(vals.begin(), vals.end());
    return hp;
  }
  std::vector<std::string> keys{"type", "minval", "maxval", "count"};
  if (kind == "log") keys.emplace_back("base");
  check_keys(value, path, "a" + std::string(kind == "int" ? "n " : " ") + kind + " hyperparameter",
             keys);
  const std::string minval_path = join(path, "minval");
  const std::string maxval_path = join(path, "maxval");
  const json& minval = required(value, "minval", path, kind == "int" ? "an int" : "a number");
  const json& maxval = required(value, "maxval", path, kind == "int" ? "an int" : "a number");
  if (kind == "int") {
    hp.type = Type::integer;
    hp.minval = static_cast<double>(to_int(minval, minval_path));
    hp.maxval = static_cast<double>(to_int(maxval, maxval_path));
  } else {
    hp.type = kind == "double" ? Type::real : Type::log;
    hp.minval = to_number(minval, minval_path);
    hp.maxval = to_number(maxval, maxval_path);
  }
  if (!(hp.minval < hp.maxval)) {
    fail(path, "expected minval < maxval but found minval " + to_flow(minval) + " and maxval " +
                   to_flow(maxval));
  }
  if (const json* count = find(value, "count")) hp.count = to_uint(*count, join(path, "count"), 1);
  if (kind == "log") {
    if (const json* base = find(value, "base")) {
      hp.base = to_number(*base, join(path, "base"));
      if (!(hp.base > 0)) refuse(join(path, "base"), "a number > 0", *base);
    }
  }
  return hp;
}

std::uint64_t ExperimentConfigReader::check_global_batch_size(
    const json& hparams, const std::vector<NamedHyperparameter>& parsed) const {
  using Type = Hyperparameter::Type;
  const std::string path = "hyperparameters.global_batch_size";
  const std::string expected =
      "an int >= 1 (a const, an int range or a categorical of ints; Determined's Keras trials "
      "need it)";
  const auto found = std::find_if(parsed.begin(), parsed.end(),
                                  [](const auto& hp) { return hp.name == "global_batch_size"; });
  if (found == parsed.end()) {
    // A misspelt name is the likely cause: name the nearest.
    std::vector<std::string> names;
    for (const auto& hp : parsed)
      names.push_back(hp.name);
    const std::string near = nearest_name("global_batch_size", names);
    fail(path, "expected " + expected + " but it is missing" +
                   (near.empty() ? "" : " (is '" + near + "' a misspelling of it?)"));
  }
  const Hyperparameter& hp = found->value;
  const json& given = hparams.at("global_batch_size");
  const auto is_size = [](const json& v) {
    return (v.is_number_unsigned() && v.get<std::uint64_t>() >= 1) ||
           (v.is_number_integer() && v.get<std::int64_t>() >= 1);
  };
  switch (hp.type) {
    case Type::constant:
      if (is_size(hp.val)) return hp.val.get<std::uint64_t>();
      break;
    case Type::integer:
      if (hp.minval >= 1) return static_cast<std::uint64_t>(hp.minval);
      break;
    case Type::categorical:
      if (std::all_of(hp.vals.begin(), hp.vals.end(), is_size)) {
        std::uint64_t smallest = UINT64_MAX;
        for (const auto& v : hp.vals)
          smallest = std::min(smallest, v.get<std::uint64_t>());
        return smallest;
      }
      break;
    default:
      break;
  }
  refuse(path, expected, given);
}

ExperimentConfig ExperimentConfigReader::read(const json& root) const {
  if (root.is_null()) fail("the top level", "expected a mapping but found an empty document");
  static const std::vector<std::string> top_keys{"name",
                                                 "environment",
                                                 "description",
                                                 "labels",
                                                 "entrypoint",
                                                 "hyperparameters",
                                                 "searcher",
                                                 "records_per_epoch",
                                                 "scheduling_unit",
                                                 "min_validation_period",
                                                 "min_checkpoint_period",
                                                 "perform_initial_validation",
                                                 "checkpoint_policy",
                                                 "checkpoint_storage",
                                                 "reproducibility",
                                                 "max_restarts",
                                                 "resources",
                                                 "optimizations",
                                                 "data",
                                                 "profiling",
                                                 "tensorboard_storage",
                                                 "data_layer"};
  check_keys(root, "", "an experiment config", top_keys, default_only_top_level_keys());
  ExperimentConfig config;
  if (const json* v = find(root, "name")) config.name = to_string(*v, "name");
  if (const json* v = find(root, "description")) config.description = to_string(*v, "description");
  if (const json* v = find(root, "labels")) {
    if (!v->is_array()) refuse("labels", "a list of strings", *v);
    for (std::size_t i = 0; i < v->size(); ++i) {
      config.labels.push_back(to_string((*v)[i], "labels[" + std::to_string(i) + "]"));
    }
  }
  config.entrypoint =
      to_string(required(root, "entrypoint", "", "the registered trial's name (model_def:Trial)"),
                "entrypoint");
  if (config.entrypoint.empty()) {
    refuse("entrypoint", "the registered trial's name (model_def:Trial)", root.at("entrypoint"));
  }

  const json& hparams = required(root, "hyperparameters", "", "a mapping of hyperparameters");
  if (!hparams.is_object()) refuse("hyperparameters", "a mapping of hyperparameters", hparams);
  for (const auto& [name, value] : hparams.items()) {
    check_hparam_name(name, "hyperparameters");
    config.hyperparameters.push_back(
        {name, to_hyperparameter(value, join("hyperparameters", name))});
  }
  const std::uint64_t smallest_batch = check_global_batch_size(hparams, config.hyperparameters);

  if (const json* v = find(root, "records_per_epoch")) {
    config.records_per_epoch = to_uint(*v, "records_per_epoch", 0);
  }
  if (const json* v = find(root, "scheduling_unit")) {
    config.scheduling_unit = to_uint(*v, "scheduling_unit", 1);
  }
  if (const json* v = find(root, "min_validation_period")) {
    config.min_validation_period = to_length(*v, "min_validation_period", false);
  }
  if (const json* v = find(root, "min_checkpoint_period")) {
    config.min_checkpoint_period = to_length(*v, "min_checkpoint_period", false);
  }
  if (const json* v = find(root, "perform_initial_validation")) {
    config.perform_initial_validation = to_bool(*v, "perform_initial_validation");
  }
  if (const json* v = find(root, "checkpoint_policy")) {
    const auto policy = to_choice(*v, "checkpoint_policy", {"best", "all", "none"});
    config.checkpoint_policy = policy == "best"  ? CheckpointPolicy::best
                               : policy == "all" ? CheckpointPolicy::all
                                                 : CheckpointPolicy::none;
  }
  config.searcher =
      read_searcher(required(root, "searcher", "", "a mapping (name, metric, max_length)"));
  if (const json* v = find(root, "checkpoint_storage")) {
    config.checkpoint_storage = read_storage(*v);
  }
  if (const json* v = find(root, "reproducibility")) {
    check_keys(*v, "reproducibility", "reproducibility", {"experiment_seed"});
    if (const json* seed = find(*v, "experiment_seed")) {
      // Determined's schema: 0 to 2^31 - 1.
      config.experiment_seed = static_cast<std::uint32_t>(
          to_uint(*seed, "reproducibility.experiment_seed", 0, 2147483647));
    }
  }
  if (const json* v = find(root, "max_restarts")) {
    config.max_restarts = to_uint(*v, "max_restarts", 0);
  }
  if (const json* v = find(root, "resources")) {
    check_keys(*v, "resources", "resources", {"slots_per_trial", "max_slots"},
               default_only_resources_keys());
    if (const json* slots = find(*v, "slots_per_trial")) {
      config.slots_per_trial = to_uint(*slots, "resources.slots_per_trial", 1);
    }
    if (const json* slots = find(*v, "max_slots"); slots && !slots->is_null()) {
      config.max_slots = to_uint(*slots, "resources.max_slots", 1);
      if (config.max_slots < config.slots_per_trial) {
        refuse(
            "resources.max_slots",
            "at least resources.slots_per_trial (" + std::to_string(config.slots_per_trial) + ")",
            *slots, ": no trial could start");
      }
    }
  }
  if (smallest_batch < config.slots_per_trial) {
    fail("hyperparameters.global_batch_size", "expected at least resources.slots_per_trial (" +
                                                  std::to_string(config.slots_per_trial) +
                                                  ") but found " + std::to_string(smallest_batch));
  }
  if (const json* v = find(root, "optimizations")) read_optimizations(*v, config);
  if (const json* v = find(root, "profiling")) {
    check_keys(*v, "profiling", "profiling",
               {"enabled", "begin_on_batch", "end_after_batch", "sync_timings"});
    if (const json* enabled = find(*v, "enabled")) {
      if (to_bool(*enabled, "profiling.enabled")) {
        fail("profiling.enabled", "expected false but found true: loadstar has no profiler yet");
      }
    }
  }
  if (const json* v = find(root, "tensorboard_storage")) {
    fail("tensorboard_storage",
         "expected no such key but found " + to_flow(*v) +
             ": loadstar writes TensorBoard event files in each trial's folder "
             "(<experiment>/trials/<id>/tensorboard) and has no separate storage for them");
  }
  if (const json* v = find(root, "data_layer")) config.data_layer = read_data_layer(*v);
  if (const json* v = find(root, "environment")) {
    config.environment_variables = read_environment(*v);
  }
  if (const json* v = find(root, "data")) {
    if (!v->is_object() && !v->is_null()) refuse("data", "a mapping", *v);
    config.data = v->is_null() ? json::object() : *v;
  }
  // Determined's `check-epoch-not-used`: a length in epochs needs records_per_epoch.
  const std::pair<const char*, Length> lengths[] = {
      {"searcher.max_length", config.searcher.max_length},
      {"min_validation_period", config.min_validation_period},
      {"min_checkpoint_period", config.min_checkpoint_period}};
  for (const auto& [path, length] : lengths) {
    if (length.unit == Unit::epochs && config.records_per_epoch == 0) {
      fail(path, "expected a length in batches or records, or records_per_epoch set, but found " +
                     to_flow(length_config_json(length)) + " with records_per_epoch unset");
    }
  }
  config.raw = root;
  return config;
}

SearcherConfig ExperimentConfigReader::read_searcher(const json& value) const {
  static const std::vector<std::string> names{"single", "grid", "random", "adaptive_asha"};
  if (!value.is_object()) refuse("searcher", "a mapping (name, metric, max_length)", value);
  SearcherConfig searcher;
  searcher.name = to_choice(required(value, "name", "searcher", "one of " + one_of_text(names)),
                            "searcher.name", names);
  check_keys(value, "searcher", "the " + searcher.name + " searcher",
             searcher_config_keys(searcher.name));
  searcher.metric = to_string(required(value, "metric", "searcher", "the validation metric's name"),
                              "searcher.metric");
  if (searcher.metric.empty()) {
    refuse("searcher.metric", "the validation metric's name", value.at("metric"));
  }
  if (const json* v = find(value, "smaller_is_better")) {
    searcher.smaller_is_better = to_bool(*v, "searcher.smaller_is_better");
  }
  searcher.max_length = to_length(required(value, "max_length", "searcher",
                                           "a length ({batches: N}, {records: N} or {epochs: N})"),
                                  "searcher.max_length", true);
  if (searcher.name == "random" || searcher.name == "adaptive_asha") {
    searcher.max_trials =
        to_uint(required(value, "max_trials", "searcher", "an int >= 1"), "searcher.max_trials", 1);
  }
  if (const json* v = find(value, "max_concurrent_trials")) {
    searcher.max_concurrent_trials = to_uint(*v, "searcher.max_concurrent_trials", 0);
  }
  if (const json* v = find(value, "mode")) {
    searcher.mode = to_choice(*v, "searcher.mode", {"aggressive", "standard", "conservative"});
  }
  if (const json* v = find(value, "divisor")) {
    searcher.divisor = to_number(*v, "searcher.divisor");
    if (!(searcher.divisor > 1)) refuse("searcher.divisor", "a number > 1", *v);
  }
  if (const json* v = find(value, "max_rungs")) {
    searcher.max_rungs = to_uint(*v, "searcher.max_rungs", 1);
  }
  if (const json* v = find(value, "bracket_rungs")) {
    if (!v->is_array()) refuse("searcher.bracket_rungs", "a list of ints >= 1", *v);
    for (std::size_t i = 0; i < v->size(); ++i) {
      searcher.bracket_rungs.push_back(
          to_uint((*v)[i], "searcher.bracket_rungs[" + std::to_string(i) + "]", 1));
    }
  }
  if (const json* v = find(value, "stop_once")) {
    searcher.stop_once = to_bool(*v, "searcher.stop_once");
  }
  if (const json* v = find(value, "source_trial_id")) {
    searcher.source_trial_id = to_uint(*v, "searcher.source_trial_id", 1);
    fail("searcher.source_trial_id",
         "expected no such key but found " + to_flow(*v) +
             ": trials are numbered per experiment folder here, so an id names no one trial; "
             "give searcher.source_checkpoint_uuid (experiment describe lists the checkpoints)");
  }
  if (const json* v = find(value, "source_checkpoint_uuid")) {
    const std::string uuid = to_string(*v, "searcher.source_checkpoint_uuid");
    if (uuid.empty() || uuid == "." || uuid == ".." || uuid.find('/') != std::string::npos) {
      refuse("searcher.source_checkpoint_uuid", "a checkpoint's uuid (a folder name)", *v);
    }
    searcher.source_checkpoint_uuid = uuid;
  }
  return searcher;
}

void ExperimentConfigReader::read_optimizations(const json& value, ExperimentConfig& config) const {
  check_keys(value, "optimizations", "optimizations",
             {"aggregation_frequency", "average_training_metrics", "average_aggregated_gradients",
              "tensor_fusion_threshold", "tensor_fusion_cycle_time", "auto_tune_tensor_fusion",
              "gradient_compression", "mixed_precision", "grad_updates_size_file"});
  if (const json* x = find(value, "aggregation_frequency")) {
    config.aggregation_frequency = to_uint(*x, "optimizations.aggregation_frequency", 1);
  }
  if (const json* x = find(value, "average_training_metrics")) {
    config.average_training_metrics = to_bool(*x, "optimizations.average_training_metrics");
  }
  if (const json* x = find(value, "average_aggregated_gradients")) {
    config.average_aggregated_gradients = to_bool(*x, "optimizations.average_aggregated_gradients");
  }
  if (const json* x = find(value, "tensor_fusion_threshold")) {
    config.tensor_fusion_threshold = to_uint(*x, "optimizations.tensor_fusion_threshold", 0);
  }
  if (const json* x = find(value, "tensor_fusion_cycle_time")) {
    // Horovod's wait between its background cycles; the collectives here run when called.
    if (to_number(*x, "optimizations.tensor_fusion_cycle_time") != 5) {
      fail("optimizations.tensor_fusion_cycle_time",
           "expected 5 (Determined's default) but found " + to_flow(*x) +
               ": loadstar's allreduce runs when the step calls it, without Horovod's background "
               "cycle to time");
    }
  }
  if (const json* x = find(value, "auto_tune_tensor_fusion")) {
    if (to_bool(*x, "optimizations.auto_tune_tensor_fusion")) {
      fail("optimizations.auto_tune_tensor_fusion",
           "expected false but found true: loadstar does not tune the fusion threshold; set "
           "optimizations.tensor_fusion_threshold");
    }
  }
  if (const json* x = find(value, "gradient_compression")) {
    if (to_bool(*x, "optimizations.gradient_compression")) {
      fail("optimizations.gradient_compression",
           "expected false but found true: loadstar's allreduce does not compress gradients");
    }
  }
  if (const json* x = find(value, "mixed_precision")) {
    if (to_string(*x, "optimizations.mixed_precision") != "O0") {
      // Determined applies O1-O3 to PyTorch trials (apex AMP); its TFKerasTrialContext reads no
      // mixed_precision setting: a Keras trial sets its dtype policy itself.
      fail("optimizations.mixed_precision",
           "expected O0 but found " + to_flow(*x) +
               ": Determined's O1-O3 are apex AMP levels for PyTorch trials; a Keras trial sets a "
               "dtype policy instead: context.set_global_policy(\"mixed_float16\") in the "
               "trial's constructor (from a hyperparameter if you like), or "
               "keras::mixed_precision::set_global_policy with the Native API");
    }
  }
  if (const json* x = find(value, "grad_updates_size_file")) {
    fail("optimizations.grad_updates_size_file",
         "expected no such key but found " + to_flow(*x) +
             ": it logs Horovod's fusion tuning, which loadstar does not do");
  }
}

CheckpointStorage ExperimentConfigReader::read_storage(const json& value) const {
  const std::string path = "checkpoint_storage";
  if (!value.is_object()) refuse(path, "a mapping", value);
  CheckpointStorage storage;
  if (const json* type = find(value, "type")) {
    if (*type != "shared_fs") {
      refuse(join(path, "type"), "shared_fs (the one storage on one machine)", *type);
    }
  }
  check_keys(value, path, "a shared_fs checkpoint storage",
             {"type", "host_path", "storage_path", "save_experiment_best", "save_trial_best",
              "save_trial_latest"},
             default_only_storage_keys());
  if (const json* v = find(value, "host_path")) {
    storage.host_path = to_string(*v, join(path, "host_path"));
  }
  if (const json* v = find(value, "storage_path")) {
    storage.storage_path = to_string(*v, join(path, "storage_path"));
  }
  if (const json* v = find(value, "save_experiment_best")) {
    storage.save_experiment_best = to_uint(*v, join(path, "save_experiment_best"), 0);
  }
  if (const json* v = find(value, "save_trial_best")) {
    storage.save_trial_best = to_uint(*v, join(path, "save_trial_best"), 0);
  }
  if (const json* v = find(value, "save_trial_latest")) {
    storage.save_trial_latest = to_uint(*v, join(path, "save_trial_latest"), 0);
  }
  return storage;
}

DataLayerConfig ExperimentConfigReader::read_data_layer(const json& value) const {
  const std::string path = "data_layer";
  if (!value.is_object()) refuse(path, "a mapping", value);
  DataLayerConfig layer;
  if (const json* type = find(value, "type")) {
    if (*type != "shared_fs") {
      refuse(join(path, "type"),
             "shared_fs (the caches live in a directory of this machine; loadstar has no S3 or "
             "GCS client)",
             *type);
    }
  }
  if (const json* v = find(value, "container_storage_path")) {
    refuse(join(path, "container_storage_path"), "no such key", *v,
           ": loadstar runs trials as processes of this machine, not in containers; give "
           "host_storage_path");
  }
  check_keys(value, path, "a shared_fs data layer", {"type", "host_storage_path"});
  if (const json* v = find(value, "host_storage_path"); v && !v->is_null()) {
    layer.host_storage_path = to_string(*v, join(path, "host_storage_path"));
    if (!std::filesystem::path(layer.host_storage_path).is_absolute()) {
      refuse(join(path, "host_storage_path"), "an absolute path", *v);
    }
  }
  return layer;
}

std::vector<std::string> ExperimentConfigReader::read_environment(const json& value) const {
  const std::string path = "environment";
  if (value.is_null()) return {};
  // Determined's container settings: only their defaults, which trials run as processes follow.
  check_keys(value, path, "an environment", {"environment_variables"},
             default_only_environment_keys());
  std::vector<std::string> variables;
  const json* list = find(value, "environment_variables");
  if (list == nullptr || list->is_null()) return variables;
  if (list->is_object()) {
    refuse(join(path, "environment_variables"), "a list of KEY=VALUE strings", *list,
           ": loadstar does not choose variables by slot type (cpu, cuda, rocm); give one list");
  }
  if (!list->is_array()) {
    refuse(join(path, "environment_variables"), "a list of KEY=VALUE strings", *list);
  }
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string item_path =
        join(path, "environment_variables") + "[" + std::to_string(i) + "]";
    const std::string item = to_string((*list)[i], item_path);
    const auto equals = item.find('=');
    if (equals == 0 || equals == std::string::npos) {
      refuse(item_path, "KEY=VALUE with a non-empty KEY", (*list)[i]);
    }
    variables.push_back(item);
  }
  return variables;
}

json hyperparameter_config_json(const Hyperparameter& hp) {
  using Type = Hyperparameter::Type;
  const auto bound = [&](double x) {
    return hp.type == Type::integer ? json(static_cast<std::int64_t>(x)) : json(x);
  };
  json out;
  switch (hp.type) {
    case Type::constant:
      return json{{"type", "const"}, {"val", hp.val}};
    case Type::categorical:
      return json{{"type", "categorical"}, {"vals", hp.vals}};
    case Type::nested:
      out = json::object();
      for (const auto& member : hp.members)
        out[member.name] = hyperparameter_config_json(member.value);
      return out;
    case Type::integer:
    case Type::real:
    case Type::log:
      out = json{{"type", hp.type == Type::integer ? "int"
                          : hp.type == Type::real  ? "double"
                                                   : "log"},
                 {"minval", bound(hp.minval)},
                 {"maxval", bound(hp.maxval)}};
      if (hp.type == Type::log) out["base"] = hp.base;
      if (hp.count) out["count"] = *hp.count;
      return out;
  }
  return out;
}

json kept_config_section(const json& raw, const std::string& section,
                         std::initializer_list<const char*> written) {
  json out = json::object();
  const auto found = raw.find(section);
  if (found != raw.end() && found->is_object()) out = *found;
  for (const char* key : written)
    out.erase(key);
  return out;
}

}  // namespace loadstar::trial::detail::expconf
#endif
