/// \file
/// One bracket of `adaptive_asha`: Determined's asynchronous successive halving
/// (`master/pkg/searcher/asha.go@0.15.6`) or, with `stop_once`, its stopping variant
/// (`asha_stopping.go@0.15.6`), as a value with a JSON state.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/trial/operations.hpp"

namespace loadstar::trial::detail {

/// A metric as JSON: a number, or `"inf"`, `"-inf"`, `"nan"` (JSON has no such numbers; Determined
/// fixed the same loss in #3999).
LOADSTAR_DECL nlohmann::json metric_to_json(double metric);

LOADSTAR_DECL double metric_from_json(const nlohmann::json& json, const std::string& owner);

/// Reads a JSON array of non-negative integers.
LOADSTAR_DECL std::vector<std::uint64_t> ids_from_json(const nlohmann::json& json,
                                                       const std::string& owner);

/// Reads a JSON object `{"<id>": value}` of ids to non-negative integers.
LOADSTAR_DECL std::map<std::uint64_t, std::uint64_t> id_map_from_json(const nlohmann::json& json,
                                                                      const std::string& owner);

/// The metric Determined gives a trial that exited early (errored): the worst there is.
inline constexpr double asha_exited_metric = std::numeric_limits<double>::max();

/// One bracket: `num_rungs` rungs, rung `i` validating at the cumulative length
/// `max(int(max_length / divisor^(num_rungs - i - 1)), 1)`. (Determined stores the running sums
/// of those values and asks a promoted trial for the difference of two sums as the length of its
/// next operation, which its sequencer reads as a cumulative target: the same lengths.)
///
/// Promotion (Determined's default): a trial waits at a rung until it is in the top
/// `int(n/divisor)` of the `n` metrics there, or is closed when the bracket is done.
/// Stopping (`stop_once`, Determined's `asyncHalvingStoppingSearch`): a trial is never paused. When
/// it reports at a rung below the top it goes on to the next rung if it ranks in the top
/// `max(int((n+1)/divisor), 1)` of that rung's metrics with its own (ahead of the trials with an
/// equal metric), and is closed for good otherwise; it is never promoted later.
class AsyncHalving {
 public:
  struct TrialMetric {
    std::uint64_t request_id = 0;
    double metric = 0;
    bool promoted = false;
  };
  struct Rung {
    std::uint64_t units_needed = 0;
    /// Sorted by metric, smaller first (a larger-is-better metric is negated).
    std::vector<TrialMetric> metrics;
    /// Signed as in Determined, whose bookkeeping of exited trials may take it below 0.
    std::int64_t outstanding_trials = 0;
  };

  LOADSTAR_DECL AsyncHalving(std::uint64_t num_rungs, Length max_length, std::uint64_t max_trials,
                             double divisor, std::uint64_t max_concurrent_trials,
                             bool smaller_is_better, bool stop_once = false);

  std::uint64_t num_rungs() const noexcept { return rungs_.size(); }
  bool stop_once() const noexcept { return stop_once_; }
  std::uint64_t max_trials() const noexcept { return max_trials_; }
  const std::vector<Rung>& rungs() const noexcept { return rungs_; }

  /// The trials it runs at once: `max_concurrent_trials` (never more than `max_trials`), or
  /// Determined's `clamp(divisor^(num_rungs-1), 1, max_trials)` when 0.
  LOADSTAR_DECL std::uint64_t concurrent_trials() const;

  /// `create()` makes a `Create` with the searcher's next request id, hyperparameters and seed.
  template <class MakeCreate>
  std::vector<Operation> initial_operations(MakeCreate&& create) {
    std::vector<Operation> ops;
    for (std::uint64_t trial = 0, n = concurrent_trials(); trial < n; ++trial) {
      add_trial(ops, create);
    }
    return ops;
  }

  template <class MakeCreate>
  std::vector<Operation> validation_completed(std::uint64_t request_id, double metric,
                                              MakeCreate&& create) {
    // The stopping variant keeps no count of pending trials (its state holds 0).
    if (!stop_once_) --pending_trials_;
    if (!smaller_is_better_) metric = -metric;
    if (stop_once_) return continue_or_stop(request_id, metric, create);
    return promote(request_id, metric, create);
  }

  LOADSTAR_DECL void trial_closed(std::uint64_t request_id);

  template <class MakeCreate>
  std::vector<Operation> trial_exited_early(std::uint64_t request_id, bool invalid_hp,
                                            MakeCreate&& create) {
    if (!stop_once_) --pending_trials_;
    if (invalid_hp) {
      std::vector<Operation> ops;
      early_exit_trials_.insert(request_id);
      ops.push_back(Close{request_id});
      closed_trials_.insert(request_id);
      ++invalid_trials_;
      const std::uint64_t highest = trial_rungs_.at(request_id);
      // The stopping variant leaves the rung's count of outstanding trials as it is.
      if (!stop_once_) --rungs_[highest].outstanding_trials;
      for (std::uint64_t index = 0; index <= highest; ++index) {
        auto& metrics = rungs_[index].metrics;
        const auto found = std::find_if(metrics.begin(), metrics.end(),
                                        [&](const auto& m) { return m.request_id == request_id; });
        if (found != metrics.end()) metrics.erase(found);
      }
      add_trial(ops, create);
      return ops;
    }
    early_exit_trials_.insert(request_id);
    closed_trials_.insert(request_id);
    if (stop_once_) return continue_or_stop(request_id, asha_exited_metric, create);
    return promote(request_id, asha_exited_metric, create);
  }

  /// Determined's estimate: trials through rung 0 over `1.2 * max_trials`, or, once all are, the
  /// share of valid trials closed if that is more.
  LOADSTAR_DECL double progress() const;

  LOADSTAR_DECL nlohmann::json state() const;

  LOADSTAR_DECL void restore(const nlohmann::json& json);

 private:
  template <class MakeCreate>
  void add_trial(std::vector<Operation>& ops, MakeCreate& create) {
    Create op = create();
    // Determined counts the trial into rung 0 when the master reports it created
    // (`trialCreated`); every Create is created, so it is counted here.
    trial_rungs_[op.request_id] = 0;
    ++rungs_[0].outstanding_trials;
    if (!stop_once_) ++pending_trials_;
    const auto id = op.request_id;
    ops.push_back(std::move(op));
    ops.push_back(ValidateAfter{id, Length{unit_, rungs_[0].units_needed}});
  }

  /// Determined's `promotionsAsync`: insert the metric in order; promote this trial if it is in
  /// the top `int((n+1)/d)`, or else the trial that moved into the top when that count grew.
  LOADSTAR_DECL std::vector<std::uint64_t> promotions(Rung& rung, std::uint64_t request_id,
                                                      double metric);

  template <class MakeCreate>
  std::vector<Operation> promote(std::uint64_t request_id, double metric, MakeCreate& create) {
    const std::uint64_t rung_index = trial_rungs_.at(request_id);
    --rungs_[rung_index].outstanding_trials;
    bool added_train_workload = false;
    std::vector<Operation> ops;
    if (rung_index + 1 == rungs_.size()) {
      rungs_[rung_index].metrics.push_back(TrialMetric{request_id, metric, false});
      if (!early_exit_trials_.contains(request_id)) {
        ops.push_back(Close{request_id});
        closed_trials_.insert(request_id);
      }
    } else {
      for (const std::uint64_t promoted : promotions(rungs_[rung_index], request_id, metric)) {
        trial_rungs_[promoted] = rung_index + 1;
        ++rungs_[rung_index + 1].outstanding_trials;
        if (!early_exit_trials_.contains(promoted)) {
          ops.push_back(
              ValidateAfter{promoted, Length{unit_, rungs_[rung_index + 1].units_needed}});
          added_train_workload = true;
          ++pending_trials_;
        } else {
          return promote(promoted, asha_exited_metric, create);
        }
      }
    }
    const std::uint64_t all_trials = trial_rungs_.size() - invalid_trials_;
    if (!added_train_workload && all_trials < max_trials_) add_trial(ops, create);
    if (rungs_[0].metrics.size() == max_trials_) close_out_rungs(ops);
    return ops;
  }

  LOADSTAR_DECL void close_out_rungs(std::vector<Operation>& ops);

  /// Determined's `continueTraining`: insert the metric before any equal one; the trial goes on
  /// if it is in the top `max(int((n+1)/d), 1)`.
  LOADSTAR_DECL bool continues(Rung& rung, std::uint64_t request_id, double metric);

  /// The stopping variant's `promoteAsync`: the trial goes on to the next rung or is closed (an
  /// exited trial only leaves its metric in the rung and, unlike promotion, never moves up);
  /// when it does not go on, a new trial starts while fewer than `max_trials` exist.
  template <class MakeCreate>
  std::vector<Operation> continue_or_stop(std::uint64_t request_id, double metric,
                                          MakeCreate& create) {
    const std::uint64_t rung_index = trial_rungs_.at(request_id);
    --rungs_[rung_index].outstanding_trials;
    const bool exited = early_exit_trials_.contains(request_id);
    bool added_train_workload = false;
    std::vector<Operation> ops;
    if (rung_index + 1 == rungs_.size()) {
      rungs_[rung_index].metrics.push_back(TrialMetric{request_id, metric, false});
      if (!exited) {
        ops.push_back(Close{request_id});
        closed_trials_.insert(request_id);
      }
    } else {
      const bool goes_on = continues(rungs_[rung_index], request_id, metric);
      if (!exited && goes_on) {
        trial_rungs_[request_id] = rung_index + 1;
        ++rungs_[rung_index + 1].outstanding_trials;
        ops.push_back(
            ValidateAfter{request_id, Length{unit_, rungs_[rung_index + 1].units_needed}});
        added_train_workload = true;
      } else if (!exited) {
        ops.push_back(Close{request_id});
        closed_trials_.insert(request_id);
      }
    }
    const std::uint64_t all_trials = trial_rungs_.size() - invalid_trials_;
    if (!added_train_workload && all_trials < max_trials_) add_trial(ops, create);
    return ops;
  }

  Unit unit_;
  std::uint64_t max_trials_;
  double divisor_;
  std::uint64_t max_concurrent_trials_;
  bool smaller_is_better_;
  bool stop_once_;
  std::vector<Rung> rungs_;
  std::map<std::uint64_t, std::uint64_t> trial_rungs_;
  std::set<std::uint64_t> early_exit_trials_;
  std::set<std::uint64_t> closed_trials_;
  std::uint64_t trials_completed_ = 0;
  std::uint64_t invalid_trials_ = 0;
  std::int64_t pending_trials_ = 0;
};

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

nlohmann::json metric_to_json(double metric) {
  if (std::isnan(metric)) return "nan";
  if (std::isinf(metric)) return metric > 0 ? "inf" : "-inf";
  return metric;
}

double metric_from_json(const nlohmann::json& json, const std::string& owner) {
  if (json.is_number()) return json.get<double>();
  if (json == "inf") return std::numeric_limits<double>::infinity();
  if (json == "-inf") return -std::numeric_limits<double>::infinity();
  if (json == "nan") return std::numeric_limits<double>::quiet_NaN();
  throw CheckpointError(owner +
                        ": expected a metric (a number, \"inf\", \"-inf\" or \"nan\") "
                        "but found " +
                        loadstar::detail::shown(json));
}

std::vector<std::uint64_t> ids_from_json(const nlohmann::json& json, const std::string& owner) {
  if (!json.is_array()) {
    throw CheckpointError(owner + ": expected an array of ids but found " +
                          loadstar::detail::shown(json));
  }
  std::vector<std::uint64_t> ids;
  for (const auto& id : json) {
    if (!id.is_number_unsigned()) {
      throw CheckpointError(owner + ": expected an array of ids but found " +
                            loadstar::detail::shown(json));
    }
    ids.push_back(id.get<std::uint64_t>());
  }
  return ids;
}

std::map<std::uint64_t, std::uint64_t> id_map_from_json(const nlohmann::json& json,
                                                        const std::string& owner) {
  if (!json.is_object()) {
    throw CheckpointError(owner + ": expected an object of ids but found " +
                          loadstar::detail::shown(json));
  }
  std::map<std::uint64_t, std::uint64_t> map;
  for (const auto& [key, value] : json.items()) {
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos ||
        !value.is_number_unsigned()) {
      throw CheckpointError(owner + ": expected an object of ids to counts but found " +
                            loadstar::detail::shown(json));
    }
    map[std::stoull(key)] = value.get<std::uint64_t>();
  }
  return map;
}

AsyncHalving::AsyncHalving(std::uint64_t num_rungs, Length max_length, std::uint64_t max_trials,
                           double divisor, std::uint64_t max_concurrent_trials,
                           bool smaller_is_better, bool stop_once)
    : unit_(max_length.unit),
      max_trials_(max_trials),
      divisor_(divisor),
      max_concurrent_trials_(max_concurrent_trials),
      smaller_is_better_(smaller_is_better),
      stop_once_(stop_once) {
  for (std::uint64_t id = 0; id < num_rungs; ++id) {
    const double downsampling = std::pow(divisor, static_cast<double>(num_rungs - id - 1));
    const auto units =
        static_cast<std::uint64_t>(static_cast<double>(max_length.value) / downsampling);
    rungs_.push_back(Rung{std::max<std::uint64_t>(units, 1), {}, 0});
  }
}

std::uint64_t AsyncHalving::concurrent_trials() const {
  if (max_concurrent_trials_ > 0) return std::min(max_concurrent_trials_, max_trials_);
  const auto automatic =
      static_cast<std::uint64_t>(std::pow(divisor_, static_cast<double>(rungs_.size() - 1)));
  return std::max<std::uint64_t>(std::min(automatic, max_trials_), 1);
}

void AsyncHalving::trial_closed(std::uint64_t request_id) {
  ++trials_completed_;
  closed_trials_.insert(request_id);
}

double AsyncHalving::progress() const {
  const auto all = static_cast<double>(rungs_[0].metrics.size());
  double progress = all / (1.2 * static_cast<double>(max_trials_));
  if (rungs_[0].metrics.size() == max_trials_) {
    const double valid =
        static_cast<double>(trials_completed_) - static_cast<double>(invalid_trials_);
    progress = std::max(valid / static_cast<double>(max_trials_), progress);
  }
  return progress;
}

nlohmann::json AsyncHalving::state() const {
  nlohmann::json rungs = nlohmann::json::array();
  for (const auto& rung : rungs_) {
    nlohmann::json metrics = nlohmann::json::array();
    for (const auto& m : rung.metrics) {
      metrics.push_back({{"request_id", m.request_id},
                         {"metric", metric_to_json(m.metric)},
                         {"promoted", m.promoted}});
    }
    rungs.push_back({{"units_needed", rung.units_needed},
                     {"metrics", metrics},
                     {"outstanding_trials", rung.outstanding_trials}});
  }
  nlohmann::json trial_rungs = nlohmann::json::object();
  for (const auto& [id, rung] : trial_rungs_)
    trial_rungs[std::to_string(id)] = rung;
  return {{"stop_once", stop_once_},           {"rungs", rungs},
          {"trial_rungs", trial_rungs},        {"early_exit_trials", early_exit_trials_},
          {"closed_trials", closed_trials_},   {"trials_completed", trials_completed_},
          {"invalid_trials", invalid_trials_}, {"pending_trials", pending_trials_}};
}

void AsyncHalving::restore(const nlohmann::json& json) {
  const std::string owner = "adaptive_asha bracket state";
  const loadstar::detail::StateReader read("adaptive_asha bracket", json);
  // A state saved before the stopping variant existed has no "stop_once": it promoted.
  const bool saved_stop_once = json.contains("stop_once") && read.get<bool>("stop_once");
  if (saved_stop_once != stop_once_) {
    throw CheckpointError(owner + ": saved with stop_once " + (saved_stop_once ? "true" : "false") +
                          " but this config's searcher.stop_once is " +
                          (stop_once_ ? "true" : "false"));
  }
  const auto rungs = read.get<nlohmann::json>("rungs");
  if (!rungs.is_array() || rungs.size() != rungs_.size()) {
    throw CheckpointError(owner + ": expected " + std::to_string(rungs_.size()) +
                          " rungs but found " + loadstar::detail::shown(rungs));
  }
  std::vector<Rung> restored;
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    const loadstar::detail::StateReader rung_read("adaptive_asha bracket rung " + std::to_string(i),
                                                  rungs[i]);
    Rung rung;
    rung.units_needed = rung_read.get<std::uint64_t>("units_needed");
    if (rung.units_needed != rungs_[i].units_needed) {
      throw CheckpointError(owner + ": rung " + std::to_string(i) + " needs " +
                            std::to_string(rung.units_needed) + " units but this config gives " +
                            std::to_string(rungs_[i].units_needed));
    }
    rung.outstanding_trials = rung_read.get<std::int64_t>("outstanding_trials");
    const auto metrics = rung_read.get<nlohmann::json>("metrics");
    if (!metrics.is_array()) {
      throw CheckpointError(owner + ": rung " + std::to_string(i) +
                            ": expected an array of metrics but found " +
                            loadstar::detail::shown(metrics));
    }
    for (const auto& m : metrics) {
      const loadstar::detail::StateReader m_read(
          "adaptive_asha bracket rung " + std::to_string(i) + " metric", m);
      rung.metrics.push_back(
          TrialMetric{m_read.get<std::uint64_t>("request_id"),
                      metric_from_json(m_read.get<nlohmann::json>("metric"), owner),
                      m_read.get<bool>("promoted")});
    }
    restored.push_back(std::move(rung));
  }
  auto trial_rungs = id_map_from_json(read.get<nlohmann::json>("trial_rungs"), owner);
  for (const auto& [id, rung] : trial_rungs) {
    if (rung >= rungs_.size()) {
      throw CheckpointError(owner + ": trial " + std::to_string(id) + " is in rung " +
                            std::to_string(rung) + " of " + std::to_string(rungs_.size()));
    }
  }
  const auto early = ids_from_json(read.get<nlohmann::json>("early_exit_trials"), owner);
  const auto closed = ids_from_json(read.get<nlohmann::json>("closed_trials"), owner);
  trials_completed_ = read.get<std::uint64_t>("trials_completed");
  invalid_trials_ = read.get<std::uint64_t>("invalid_trials");
  pending_trials_ = read.get<std::int64_t>("pending_trials");
  rungs_ = std::move(restored);
  trial_rungs_ = std::move(trial_rungs);
  early_exit_trials_ = std::set<std::uint64_t>(early.begin(), early.end());
  closed_trials_ = std::set<std::uint64_t>(closed.begin(), closed.end());
}

std::vector<std::uint64_t> AsyncHalving::promotions(Rung& rung, std::uint64_t request_id,
                                                    double metric) {
  const auto size = static_cast<double>(rung.metrics.size());
  const auto old_num_promote = static_cast<std::uint64_t>(size / divisor_);
  const auto num_promote = static_cast<std::uint64_t>((size + 1) / divisor_);
  const auto insert = static_cast<std::uint64_t>(
      std::upper_bound(rung.metrics.begin(), rung.metrics.end(), metric,
                       [](double value, const TrialMetric& m) { return value < m.metric; }) -
      rung.metrics.begin());
  const bool promote_now = insert < num_promote;
  rung.metrics.insert(rung.metrics.begin() + static_cast<std::ptrdiff_t>(insert),
                      TrialMetric{request_id, metric, promote_now});
  if (promote_now) return {request_id};
  if (num_promote != old_num_promote && !rung.metrics[old_num_promote].promoted) {
    rung.metrics[old_num_promote].promoted = true;
    return {rung.metrics[old_num_promote].request_id};
  }
  return {};
}

bool AsyncHalving::continues(Rung& rung, std::uint64_t request_id, double metric) {
  const auto size = static_cast<double>(rung.metrics.size());
  const auto num_promote =
      std::max<std::uint64_t>(static_cast<std::uint64_t>((size + 1) / divisor_), 1);
  const auto insert = static_cast<std::uint64_t>(
      std::lower_bound(rung.metrics.begin(), rung.metrics.end(), metric,
                       [](const TrialMetric& m, double value) { return m.metric < value; }) -
      rung.metrics.begin());
  const bool goes_on = insert < num_promote;
  rung.metrics.insert(rung.metrics.begin() + static_cast<std::ptrdiff_t>(insert),
                      TrialMetric{request_id, metric, goes_on});
  return goes_on;
}

void AsyncHalving::close_out_rungs(std::vector<Operation>& ops) {
  for (const auto& rung : rungs_) {
    if (rung.outstanding_trials > 0) break;
    for (const auto& m : rung.metrics) {
      if (!m.promoted && !closed_trials_.contains(m.request_id) &&
          !early_exit_trials_.contains(m.request_id)) {
        ops.push_back(Close{m.request_id});
        closed_trials_.insert(m.request_id);
      }
    }
  }
}

}  // namespace loadstar::trial::detail
#endif
