/// \file
/// Reading an experiment folder for `experiment describe` and `experiment list`: the trials'
/// `trial.json` (written by the runner) and `metrics.jsonl`, summarised as text and curves.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/trial/detail/experiment_record.hpp"
#include "loadstar/trial/plot.hpp"
#include "loadstar/trial/searcher.hpp"

namespace loadstar::trial::detail {

/// `dir/trials/<id>`.
inline std::filesystem::path trial_dir(const std::filesystem::path& dir, std::uint64_t trial_id) {
  return dir / "trials" / std::to_string(trial_id);
}

/// A trial's `trial.json`, or null when it has none yet or it does not parse (the runner writes
/// it atomically, so the latter means someone else's file; describe shows what it can).
LOADSTAR_DECL nlohmann::json read_trial_json(const std::filesystem::path& trial_folder);

/// A number for a table: `0.3412`, or `-` when absent.
LOADSTAR_DECL std::string format_metric(const std::optional<double>& value);

/// The searcher metric inside a validation entry of `trial.json`: a number, or an object
/// holding the metric by name.
LOADSTAR_DECL std::optional<double> validation_value(const nlohmann::json& value,
                                                     const std::string& metric);

/// The curves of every trial of the experiment in `dir` that has metrics, by trial id.
LOADSTAR_DECL std::vector<TrialCurves> experiment_curves(const std::filesystem::path& dir,
                                                         const ExperimentRecord& record);

/// Prints the experiment in `dir` to `out`: its state, searcher and progress, then one line per
/// trial (state, batches trained, best validation, restarts, hyperparameters), then its
/// checkpoints and where the metrics are.
LOADSTAR_DECL void describe_experiment_to(const std::filesystem::path& dir, std::ostream& out);

/// How many trials the experiment in `dir` runs at once on this machine, and why
/// (`trials_at_once`): "4 trials of 9 (max_concurrent_trials 0: bounded by 8 cores / 2 slots per
/// trial)".
LOADSTAR_DECL std::string describe_trials_at_once(const std::filesystem::path& dir,
                                                  const ExperimentRecord& record);

/// One experiment found by `experiment list`.
struct ExperimentListing {
  std::filesystem::path dir;
  std::uint64_t id = 0;
  std::string state;
  std::string searcher;
  std::size_t trials = 0;
  std::string name;
  std::string description;
};

/// The experiment folders directly under `root` (and `root` itself when it is one), sorted by
/// path; unreadable ones are listed with state `UNREADABLE`. `ConfigError` when `root` is not a
/// folder.
LOADSTAR_DECL std::vector<ExperimentListing> list_experiment_folders(
    const std::filesystem::path& root);

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

nlohmann::json read_trial_json(const std::filesystem::path& trial_folder) {
  const auto file = trial_folder / "trial.json";
  std::error_code error;
  if (!std::filesystem::exists(file, error)) return nullptr;
  try {
    auto json = nlohmann::json::parse(keras::detail::read_bytes(file));
    return json.is_object() ? json : nlohmann::json();
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  } catch (const IoError&) {
    return nullptr;
  }
}

std::string format_metric(const std::optional<double>& value) {
  if (!value) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", *value);
  return buffer;
}

std::optional<double> validation_value(const nlohmann::json& value, const std::string& metric) {
  if (value.is_number()) return value.get<double>();
  if (value.is_object()) {
    for (const std::string& key : {metric, std::string("searcher_metric"), std::string("value")}) {
      if (value.contains(key) && value[key].is_number()) return value[key].get<double>();
    }
    if (value.contains("metrics") && value["metrics"].is_object()) {
      return validation_value(value["metrics"], metric);
    }
  }
  return std::nullopt;
}

std::vector<TrialCurves> experiment_curves(const std::filesystem::path& dir,
                                           const ExperimentRecord& record) {
  std::vector<TrialCurves> curves;
  for (const auto& trial : record.trials) {
    const auto file = trial_dir(dir, trial.id) / "metrics.jsonl";
    if (!std::filesystem::exists(file)) continue;
    curves.push_back({trial.id, read_metrics(file)});
  }
  return curves;
}

std::string describe_trials_at_once(const std::filesystem::path& dir,
                                    const ExperimentRecord& record) {
  try {
    const ExperimentConfig config =
        experiment_config_from_json(record.config, (dir / "experiment.json").string());
    const std::uint64_t cores = std::thread::hardware_concurrency();
    const std::uint64_t limit = make_searcher(config, record.seed)->max_concurrent_trials();
    const std::uint64_t at_once = trials_at_once(config, limit, cores);
    std::string text = std::to_string(at_once) + (at_once == 1 ? " trial" : " trials");
    const std::uint64_t unbounded = trials_at_once(
        [&] {
          ExperimentConfig without = config;
          without.max_slots = 0;
          return without;
        }(),
        limit, cores);
    if (at_once < unbounded) {
      text += " (resources.max_slots " + std::to_string(config.max_slots) + " / " +
              std::to_string(config.slots_per_trial) + " slots per trial)";
    } else if (config.searcher.max_concurrent_trials > 0) {
      text += " (searcher.max_concurrent_trials " +
              std::to_string(config.searcher.max_concurrent_trials) + ")";
    } else if (at_once < limit) {
      text += " of " + std::to_string(limit) + " (max_concurrent_trials 0: bounded by " +
              std::to_string(cores) + " cores / " + std::to_string(config.slots_per_trial) +
              " slots per trial)";
    }
    return text;
  } catch (const Error& e) {
    return std::string("unknown (") + e.what() + ")";
  }
}

void describe_experiment_to(const std::filesystem::path& dir, std::ostream& out) {
  const ExperimentRecord record = read_experiment_record(dir);
  out << "experiment " << record.id << " in '" << dir.string() << "': " << record.state
      << (record.test ? " (test)" : "") << "\n";
  if (!record.name.empty()) out << "  name:        " << record.name << "\n";
  if (!record.description.empty()) out << "  description: " << record.description << "\n";
  out << "  config:      " << record.config_file << "\n";
  out << "  searcher:    " << record.searcher_name << ", metric " << record.metric << " ("
      << (record.smaller_is_better ? "smaller" : "larger") << " is better), progress "
      << static_cast<int>(record.progress * 100 + 0.5) << "%\n";
  out << "  seed:        " << record.seed << "\n";
  out << "  at once:     " << describe_trials_at_once(dir, record) << "\n";
  out << "  checkpoints: " << checkpoint_root(dir, record).string() << "\n";
  out << "\n";
  const std::string best_header = "best " + record.metric;
  const int best_width = static_cast<int>(std::max<std::size_t>(14, best_header.size() + 2));
  out << std::left << std::setw(7) << "trial" << std::setw(11) << "state" << std::setw(10)
      << "batches" << std::setw(best_width) << best_header << std::setw(10) << "restarts"
      << "hyperparameters\n";
  std::ostringstream checkpoints;
  for (const auto& trial : record.trials) {
    const auto folder = trial_dir(dir, trial.id);
    const nlohmann::json json = read_trial_json(folder);
    std::string state = trial.state;
    std::uint64_t batches = trial.total_batches;
    std::optional<double> best = trial.best_validation;
    std::uint64_t restarts = 0;
    if (json.is_object()) {
      // The runner's view is newer while the trial runs; the experiment's decides the end state.
      if (const std::string ended = json.value("state", std::string());
          trial.state == "ACTIVE" && (ended == "ERROR" || ended == "INVALID")) {
        state = ended;
      }
      if (json.contains("total_batches") && json["total_batches"].is_number_unsigned()) {
        batches = std::max(batches, json["total_batches"].get<std::uint64_t>());
      }
      if (json.contains("best_validation")) {
        if (const auto value = validation_value(json["best_validation"], record.metric)) {
          best = value;
        }
      }
      if (json.contains("restarts") && json["restarts"].is_number_unsigned()) {
        restarts = json["restarts"].get<std::uint64_t>();
      }
    }
    out << std::left << std::setw(7) << trial.id << std::setw(11) << state << std::setw(10)
        << batches << std::setw(best_width) << format_metric(best) << std::setw(10) << restarts
        << loadstar::detail::shown(trial.hparams) << "\n";
    if (!trial.error.empty()) {
      out << "         " << (trial.state == "INVALID" ? "invalid: " : "error: ") << trial.error
          << "\n";
    }
    if (json.is_object() && json.contains("checkpoints") && json["checkpoints"].is_array()) {
      const std::string latest = json.value("latest_checkpoint", std::string());
      const std::string best_uuid = json.value("best_checkpoint", std::string());
      for (const auto& checkpoint : json["checkpoints"]) {
        if (!checkpoint.is_object()) continue;
        const std::string uuid = checkpoint.value("uuid", std::string());
        checkpoints << "  trial " << trial.id << "  " << uuid << "  batches "
                    << checkpoint.value("batches", std::uint64_t{0});
        if (checkpoint.contains("validation")) {
          checkpoints << "  " << record.metric << " "
                      << format_metric(validation_value(checkpoint["validation"], record.metric));
        }
        if (uuid == latest) checkpoints << "  latest";
        if (uuid == best_uuid) checkpoints << "  best";
        checkpoints << "\n";
      }
    }
  }
  if (!checkpoints.str().empty()) {
    out << "\ncheckpoints (in " << checkpoint_root(dir, record).string() << "):\n"
        << checkpoints.str();
  }
  if (!record.best_checkpoints.empty()) {
    out << "\nbest checkpoints of the experiment (save_experiment_best):\n";
    for (const auto& best : record.best_checkpoints) {
      out << "  trial " << best.value("trial_id", std::uint64_t{0}) << "  "
          << best.value("uuid", std::string()) << "  " << record.metric << " "
          << format_metric(
                 validation_value(best.value("validation", nlohmann::json()), record.metric))
          << "\n";
    }
  }
  out << "\nmetrics: " << (dir / "trials" / "<id>" / "metrics.jsonl").string() << "\n";
}

std::vector<ExperimentListing> list_experiment_folders(const std::filesystem::path& root) {
  if (!std::filesystem::is_directory(root)) {
    throw ConfigError(
        "experiment root '" + root.string() + "': expected a folder but found " +
        (std::filesystem::exists(root) ? std::string("a file") : std::string("nothing")));
  }
  std::vector<std::filesystem::path> candidates;
  if (std::filesystem::exists(experiment_file(root))) candidates.push_back(root);
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (entry.is_directory() && std::filesystem::exists(experiment_file(entry.path()))) {
      candidates.push_back(entry.path());
    }
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<ExperimentListing> listings;
  for (const auto& dir : candidates) {
    ExperimentListing listing;
    listing.dir = dir;
    try {
      const auto record = read_experiment_record(dir);
      listing.id = record.id;
      listing.state = record.state;
      listing.searcher = record.searcher_name;
      listing.trials = record.trials.size();
      listing.name = record.name;
      listing.description = record.description;
    } catch (const Error&) {
      listing.state = "UNREADABLE";
    }
    listings.push_back(std::move(listing));
  }
  return listings;
}

}  // namespace loadstar::trial::detail
#endif
