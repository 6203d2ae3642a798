/// \file
/// An experiment folder's `experiment.json` as data: the experiment's identity and state, the
/// searcher's state and every trial with its pending searcher operations. It is rewritten
/// atomically after every event, so that a killed experiment resumes from the last one.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/trial/experiment_config.hpp"

namespace loadstar::trial::detail {

inline constexpr const char* experiment_format = "loadstar-experiment";
inline constexpr int experiment_format_version = 1;

LOADSTAR_DECL std::optional<Unit> length_unit_from_name(const std::string& name);

/// `{"epochs": 5}`.
inline nlohmann::json pending_length_json(const Length& length) {
  return length_to_json(length);
}

/// One trial as the experiment tracks it.
struct TrialRecord {
  std::uint64_t id = 0;
  std::uint64_t request_id = 0;
  nlohmann::json hparams = nlohmann::json::object();
  std::uint32_t trial_seed = 0;
  /// `ACTIVE`, `COMPLETED`, `ERROR`, or `INVALID` (it threw `InvalidHP`).
  std::string state = "ACTIVE";
  /// The searcher's `ValidateAfter` lengths not yet reached, oldest first.
  std::deque<Length> pending;
  /// The searcher closed the trial: it ends once `pending` is done.
  bool closed = false;
  std::uint64_t total_batches = 0;
  /// The searcher metric of its last validation.
  std::optional<double> searcher_metric;
  /// Its best searcher metric.
  std::optional<double> best_validation;
  /// Why it ended in `ERROR` or `INVALID`.
  std::string error;
};

/// The contents of `experiment.json`.
struct ExperimentRecord {
  std::uint64_t id = 0;
  std::uint32_t seed = 0;
  /// `ACTIVE`, `COMPLETED`, `ERROR`, `PAUSED` (a resume continues it) or `KILLED`.
  std::string state = "ACTIVE";
  /// Created with `--test` (Determined's one-batch smoke test).
  bool test = false;
  /// The configuration file it was created from and its contents as given (`raw`), to tell
  /// whether `experiment create` names the same experiment again.
  std::string config_file;
  nlohmann::json raw = nlohmann::json::object();
  /// `to_json(ExperimentConfig)` after the `--test` overrides: what trials run with.
  nlohmann::json config = nlohmann::json::object();
  /// The config's `name` (empty when it has none).
  std::string name;
  std::string description;
  std::string searcher_name;
  std::string metric;
  bool smaller_is_better = true;
  /// Null until the searcher's initial operations are applied.
  nlohmann::json searcher_state;
  double progress = 0;
  bool shutdown = false;
  std::uint64_t next_trial_id = 1;
  std::vector<TrialRecord> trials;
  /// Where checkpoints go (`<dir>/checkpoints` or `host_path/storage_path`).
  std::string checkpoint_dir;
  /// `save_experiment_best`: the best checkpoints over all trials, set at the end.
  nlohmann::json best_checkpoints = nlohmann::json::array();

  LOADSTAR_DECL TrialRecord* find_request(std::uint64_t request_id);
  LOADSTAR_DECL TrialRecord* find_trial(std::uint64_t trial_id);
};

inline nlohmann::json optional_number(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json();
}

LOADSTAR_DECL nlohmann::json to_json(const TrialRecord& trial);

LOADSTAR_DECL nlohmann::json to_json(const ExperimentRecord& record);

/// Reads member `key` of `object` as `T`; `FormatError` naming the file and key otherwise.
template <typename T>
T member(const nlohmann::json& object, const char* key, const std::filesystem::path& file,
         const std::string& where) {
  if (!object.is_object() || !object.contains(key)) {
    throw FormatError("experiment '" + file.string() + "': " + where + key +
                      ": expected a value but found none");
  }
  try {
    return object.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw FormatError("experiment '" + file.string() + "': " + where + key +
                      ": expected a value of another type but found " +
                      loadstar::detail::shown(object.at(key)).substr(0, 100));
  }
}

LOADSTAR_DECL std::optional<double> optional_member(const nlohmann::json& object, const char* key);

/// Parses `experiment.json`'s text; `file` names it in messages. Throws `FormatError`.
LOADSTAR_DECL ExperimentRecord experiment_record_from_json(const nlohmann::json& json,
                                                           const std::filesystem::path& file);

/// `dir/experiment.json`.
inline std::filesystem::path experiment_file(const std::filesystem::path& dir) {
  return dir / "experiment.json";
}

/// Reads `dir/experiment.json`: `ConfigError` when `dir` holds no experiment, `FormatError`
/// when the file is not one.
LOADSTAR_DECL ExperimentRecord read_experiment_record(const std::filesystem::path& dir);

/// Where the checkpoints of the experiment in `dir` go.
LOADSTAR_DECL std::filesystem::path checkpoint_root(const std::filesystem::path& dir,
                                                    const ExperimentRecord& record);

/// Writes `dir/experiment.json` atomically.
inline void write_experiment_record(const std::filesystem::path& dir,
                                    const ExperimentRecord& record) {
  keras::detail::write_atomically(experiment_file(dir), to_json(record).dump(2) + "\n");
}

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

std::optional<Unit> length_unit_from_name(const std::string& name) {
  if (name == "batches") return Unit::batches;
  if (name == "records") return Unit::records;
  if (name == "epochs") return Unit::epochs;
  return std::nullopt;
}

TrialRecord* ExperimentRecord::find_request(std::uint64_t request_id) {
  for (auto& trial : trials) {
    if (trial.request_id == request_id) return &trial;
  }
  return nullptr;
}

TrialRecord* ExperimentRecord::find_trial(std::uint64_t trial_id) {
  for (auto& trial : trials) {
    if (trial.id == trial_id) return &trial;
  }
  return nullptr;
}

nlohmann::json to_json(const TrialRecord& trial) {
  nlohmann::json pending = nlohmann::json::array();
  for (const auto& length : trial.pending)
    pending.push_back(pending_length_json(length));
  return {{"id", trial.id},
          {"request_id", trial.request_id},
          {"hparams", trial.hparams},
          {"trial_seed", trial.trial_seed},
          {"state", trial.state},
          {"pending", pending},
          {"closed", trial.closed},
          {"total_batches", trial.total_batches},
          {"searcher_metric", optional_number(trial.searcher_metric)},
          {"best_validation", optional_number(trial.best_validation)},
          {"error", trial.error}};
}

nlohmann::json to_json(const ExperimentRecord& record) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& trial : record.trials)
    trials.push_back(to_json(trial));
  return {{"format", experiment_format},
          {"version", experiment_format_version},
          {"id", record.id},
          {"seed", record.seed},
          {"state", record.state},
          {"test", record.test},
          {"config_file", record.config_file},
          {"raw", record.raw},
          {"config", record.config},
          {"name", record.name},
          {"description", record.description},
          {"searcher",
           {{"name", record.searcher_name},
            {"metric", record.metric},
            {"smaller_is_better", record.smaller_is_better}}},
          {"searcher_state", record.searcher_state},
          {"progress", record.progress},
          {"shutdown", record.shutdown},
          {"next_trial_id", record.next_trial_id},
          {"trials", trials},
          {"checkpoint_dir", record.checkpoint_dir},
          {"best_checkpoints", record.best_checkpoints}};
}

std::optional<double> optional_member(const nlohmann::json& object, const char* key) {
  if (object.contains(key) && object.at(key).is_number()) return object.at(key).get<double>();
  return std::nullopt;
}

ExperimentRecord experiment_record_from_json(const nlohmann::json& json,
                                             const std::filesystem::path& file) {
  if (!json.is_object() || json.value("format", std::string()) != experiment_format) {
    throw FormatError("experiment '" + file.string() + "': expected format '" + experiment_format +
                      "' but found " +
                      (json.is_object() && json.contains("format")
                           ? loadstar::detail::shown(json["format"])
                           : std::string("none")));
  }
  ExperimentRecord record;
  record.id = member<std::uint64_t>(json, "id", file, "");
  record.seed = member<std::uint32_t>(json, "seed", file, "");
  record.state = member<std::string>(json, "state", file, "");
  record.test = member<bool>(json, "test", file, "");
  record.config_file = member<std::string>(json, "config_file", file, "");
  record.raw = member<nlohmann::json>(json, "raw", file, "");
  record.config = member<nlohmann::json>(json, "config", file, "");
  record.name = json.value("name", std::string());
  record.description = json.value("description", std::string());
  const auto searcher = member<nlohmann::json>(json, "searcher", file, "");
  record.searcher_name = member<std::string>(searcher, "name", file, "searcher.");
  record.metric = member<std::string>(searcher, "metric", file, "searcher.");
  record.smaller_is_better = member<bool>(searcher, "smaller_is_better", file, "searcher.");
  record.searcher_state = json.value("searcher_state", nlohmann::json());
  record.progress = json.value("progress", 0.0);
  record.shutdown = json.value("shutdown", false);
  record.next_trial_id = member<std::uint64_t>(json, "next_trial_id", file, "");
  record.checkpoint_dir = member<std::string>(json, "checkpoint_dir", file, "");
  record.best_checkpoints = json.value("best_checkpoints", nlohmann::json::array());
  const auto trials = member<nlohmann::json>(json, "trials", file, "");
  if (!trials.is_array()) {
    throw FormatError("experiment '" + file.string() + "': trials: expected an array but found " +
                      loadstar::detail::shown(trials).substr(0, 100));
  }
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const auto& item = trials[i];
    const std::string where = "trials[" + std::to_string(i) + "].";
    TrialRecord trial;
    trial.id = member<std::uint64_t>(item, "id", file, where);
    trial.request_id = member<std::uint64_t>(item, "request_id", file, where);
    trial.hparams = member<nlohmann::json>(item, "hparams", file, where);
    trial.trial_seed = member<std::uint32_t>(item, "trial_seed", file, where);
    trial.state = member<std::string>(item, "state", file, where);
    for (const auto& length : member<nlohmann::json>(item, "pending", file, where)) {
      if (!length.is_object() || length.size() != 1 ||
          !length_unit_from_name(length.begin().key()) || !length.begin()->is_number_unsigned()) {
        throw FormatError("experiment '" + file.string() + "': " + where +
                          "pending: expected lengths like {\"batches\": 10} but found " +
                          loadstar::detail::shown(length).substr(0, 100));
      }
      trial.pending.push_back(
          {*length_unit_from_name(length.begin().key()), length.begin()->get<std::uint64_t>()});
    }
    trial.closed = member<bool>(item, "closed", file, where);
    trial.total_batches = member<std::uint64_t>(item, "total_batches", file, where);
    trial.searcher_metric = optional_member(item, "searcher_metric");
    trial.best_validation = optional_member(item, "best_validation");
    trial.error = item.value("error", std::string());
    record.trials.push_back(std::move(trial));
  }
  return record;
}

ExperimentRecord read_experiment_record(const std::filesystem::path& dir) {
  const auto file = experiment_file(dir);
  if (!std::filesystem::exists(file)) {
    throw ConfigError(
        "experiment folder '" + dir.string() + "': expected an experiment.json but found " +
        (std::filesystem::exists(dir) ? std::string("none in it") : std::string("no such folder")));
  }
  const std::string text = keras::detail::read_bytes(file);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw FormatError("experiment '" + file.string() +
                      "': expected JSON but found text that does not parse (" + error.what() + ")");
  }
  return experiment_record_from_json(json, file);
}

std::filesystem::path checkpoint_root(const std::filesystem::path& dir,
                                      const ExperimentRecord& record) {
  const std::filesystem::path stored = record.checkpoint_dir;
  return stored.is_absolute() ? stored : dir / stored;
}

}  // namespace loadstar::trial::detail
#endif
