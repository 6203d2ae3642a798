/// \file
/// A trial folder's files: `metrics.jsonl` (appended line by line, cut back on resume) and
/// `trial.json` (replaced atomically).
#pragma once

#include "loadstar/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"

namespace loadstar::trial::detail {

// Headers of the trial layer name loadstar::detail::StateReader as detail::StateReader from
// inside loadstar::trial; this keeps that name finding it once this namespace exists.
using loadstar::detail::StateReader;

/// One checkpoint as `trial.json` lists it.
struct CheckpointEntry {
  std::string uuid;
  std::uint64_t batches = 0;
  std::uint64_t records = 0;
  double epochs = 0;
  /// The searcher metric of the validation at the same batch count, if any.
  std::optional<double> validation;
};

/// `trial.json`.
struct TrialJson {
  std::uint64_t trial_id = 1;
  std::uint64_t experiment_id = 1;
  nlohmann::json hparams = nlohmann::json::object();
  std::uint32_t trial_seed = 0;
  /// `ACTIVE`, `COMPLETED`, `ERROR`, or `INVALID` (it threw `InvalidHP`).
  std::string state = "ACTIVE";
  std::uint64_t restarts = 0;
  std::uint64_t total_batches = 0;
  std::string latest_checkpoint;
  std::string best_checkpoint;
  std::optional<double> best_validation;
  std::vector<CheckpointEntry> checkpoints;
  /// The error that ended the trial (state `ERROR` or `INVALID`).
  std::string error;

  LOADSTAR_DECL nlohmann::json to_json() const;

  LOADSTAR_DECL static TrialJson from_json(const nlohmann::json& json, const std::string& owner);
};

/// Reads `trial.json` in `trial_dir`, if there is one; `CheckpointError` naming it when it is not
/// a trial record.
LOADSTAR_DECL std::optional<TrialJson> read_trial_record(const std::filesystem::path& trial_dir);

LOADSTAR_DECL void write_trial_record(const std::filesystem::path& trial_dir,
                                      const TrialJson& record);

/// `metrics.jsonl`: one JSON object per line, each appended with one `write`, so a process killed
/// at any moment leaves whole lines and at most a cut last one (which a resume drops).
class MetricsFile {
 public:
  explicit MetricsFile(std::filesystem::path path) : path_(std::move(path)) {}

  /// Keeps the first `lines` lines (rewriting the file atomically) and counts from there.
  LOADSTAR_DECL void keep(std::uint64_t lines);

  LOADSTAR_DECL void append(const nlohmann::json& line);

  std::uint64_t lines() const noexcept { return lines_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  std::uint64_t lines_ = 0;
};

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

nlohmann::json TrialJson::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : checkpoints) {
    nlohmann::json entry = {
        {"uuid", c.uuid}, {"batches", c.batches}, {"records", c.records}, {"epochs", c.epochs}};
    if (c.validation) entry["validation"] = *c.validation;
    list.push_back(std::move(entry));
  }
  nlohmann::json json = {{"trial_id", trial_id},
                         {"experiment_id", experiment_id},
                         {"hparams", hparams},
                         {"trial_seed", trial_seed},
                         {"state", state},
                         {"restarts", restarts},
                         {"total_batches", total_batches},
                         {"latest_checkpoint", latest_checkpoint},
                         {"best_checkpoint", best_checkpoint},
                         {"best_validation", best_validation ? nlohmann::json(*best_validation)
                                                             : nlohmann::json(nullptr)},
                         {"checkpoints", std::move(list)}};
  if (!error.empty()) json["error"] = error;
  return json;
}

TrialJson TrialJson::from_json(const nlohmann::json& json, const std::string& owner) {
  const loadstar::detail::StateReader read(owner, json);
  TrialJson record;
  record.trial_id = read.get<std::uint64_t>("trial_id");
  record.experiment_id = json.value("experiment_id", std::uint64_t{1});
  record.hparams = read.get<nlohmann::json>("hparams");
  record.trial_seed = read.get<std::uint32_t>("trial_seed");
  record.state = read.get<std::string>("state");
  record.restarts = read.get<std::uint64_t>("restarts");
  record.total_batches = read.get<std::uint64_t>("total_batches");
  record.latest_checkpoint = read.get<std::string>("latest_checkpoint");
  record.best_checkpoint = read.get<std::string>("best_checkpoint");
  const auto best = read.get<nlohmann::json>("best_validation");
  if (best.is_number()) record.best_validation = best.get<double>();
  for (const auto& entry : read.get<nlohmann::json>("checkpoints")) {
    const loadstar::detail::StateReader e(owner + " checkpoint", entry);
    CheckpointEntry c{e.get<std::string>("uuid"), e.get<std::uint64_t>("batches"),
                      e.get<std::uint64_t>("records"), e.get<double>("epochs"), std::nullopt};
    if (entry.contains("validation") && entry["validation"].is_number())
      c.validation = entry["validation"].get<double>();
    record.checkpoints.push_back(std::move(c));
  }
  record.error = json.value("error", std::string());
  return record;
}

std::optional<TrialJson> read_trial_record(const std::filesystem::path& trial_dir) {
  const auto file = trial_dir / "trial.json";
  if (!std::filesystem::exists(file)) return std::nullopt;
  try {
    return TrialJson::from_json(nlohmann::json::parse(keras::detail::read_bytes(file)),
                                "trial record '" + file.string() + "'");
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("trial record '" + file.string() +
                          "': expected JSON but the file is truncated or corrupt (" + e.what() +
                          ")");
  }
}

void write_trial_record(const std::filesystem::path& trial_dir, const TrialJson& record) {
  std::filesystem::create_directories(trial_dir);
  keras::detail::write_atomically(trial_dir / "trial.json", record.to_json().dump(2) + "\n");
}

void MetricsFile::keep(std::uint64_t lines) {
  std::string kept;
  if (std::filesystem::exists(path_)) {
    const std::string bytes = keras::detail::read_bytes(path_);
    std::size_t at = 0;
    for (std::uint64_t i = 0; i < lines; ++i) {
      const auto end = bytes.find('\n', at);
      if (end == std::string::npos) {
        throw CheckpointError("metrics '" + path_.string() + "': expected at least " +
                              std::to_string(lines) + " lines but found " + std::to_string(i));
      }
      at = end + 1;
    }
    kept = bytes.substr(0, at);
    if (kept.size() == bytes.size()) {
      lines_ = lines;
      return;
    }
  } else if (lines != 0) {
    throw CheckpointError("metrics '" + path_.string() + "': expected " + std::to_string(lines) +
                          " lines but the file is missing");
  }
  std::filesystem::create_directories(path_.parent_path());
  keras::detail::write_atomically(path_, kept);
  lines_ = lines;
}

void MetricsFile::append(const nlohmann::json& line) {
  const std::string text = line.dump() + "\n";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw IoError("metrics '" + path_.string() + "': cannot open: " + std::strerror(errno));
  const ::ssize_t n = ::write(fd, text.data(), text.size());
  const int saved = errno;
  ::close(fd);
  if (n != static_cast<::ssize_t>(text.size())) {
    throw IoError("metrics '" + path_.string() + "': cannot append: " + std::strerror(saved));
  }
  ++lines_;
}

}  // namespace loadstar::trial::detail
#endif
