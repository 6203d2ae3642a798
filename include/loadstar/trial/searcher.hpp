/// \file
/// `Searcher`: Determined's hyperparameter searchers (`master/pkg/searcher/*.go@0.15.6`), event
/// driven: the experiment reports what happened to its trials and runs the operations the
/// searcher answers with. `single`, `grid`, `random` and `adaptive_asha`.
///
/// Over 800 lines as one feature (the searchers share `Searcher`'s event loop and state): the
/// bodies, most of the file, are compiled into loadstar_trial under LOADSTAR_SEPARATE_COMPILATION.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/config.hpp"
#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/random.hpp"
#include "loadstar/trial/detail/async_halving.hpp"
#include "loadstar/trial/detail/rng_state.hpp"
#include "loadstar/trial/experiment_config.hpp"
#include "loadstar/trial/hyperparameters.hpp"
#include "loadstar/trial/operations.hpp"

namespace loadstar::trial {

/// Why a trial ended before its operations were done (Determined's `ExitedReason`).
enum class ExitedReason {
  /// It failed (after its restarts).
  errored,
  /// It raised `InvalidHP`: its hyperparameters cannot be trained; the searcher replaces it.
  invalid_hp,
  /// The user stopped it.
  user_canceled,
};

/// A hyperparameter searcher. The experiment runs the operations of `initial_operations()`, then
/// of each event it reports:
/// \code
/// auto searcher = make_searcher(config, experiment_seed);
/// std::deque<Operation> todo(...searcher->initial_operations());
/// // Create: start a trial; ValidateAfter: train it to op.length, validate, then
/// //   append(searcher->validation_completed(op.request_id, metric, op));
/// // Close: the trial ends once its operations are done, then
/// //   append(searcher->trial_closed(id));  (also after a trial that failed:
/// //   append(searcher->trial_exited_early(id)) first)
/// // Shutdown: the search is over.
/// \endcode
/// Trial seeds and random hyperparameters come from one generator seeded with the experiment
/// seed, so a search is a function of its seed and of the metrics it is told. `state()` /
/// `restore()` save and continue a search.
class Searcher {
 public:
  virtual ~Searcher() = default;
  Searcher(const Searcher&) = delete;
  Searcher& operator=(const Searcher&) = delete;

  /// `single`, `grid`, `random` or `adaptive_asha`.
  const std::string& name() const noexcept { return config_.searcher.name; }
  std::uint32_t experiment_seed() const noexcept { return experiment_seed_; }

  /// The first trials (each `Create`, its first `ValidateAfter`, and for the searchers that
  /// train a trial once, its `Close`).
  LOADSTAR_DECL std::vector<Operation> initial_operations();

  /// Trial `request_id` finished `op` with searcher metric `metric`. `ConfigError` for an
  /// unknown trial, an operation reported twice or a NaN metric.
  LOADSTAR_DECL std::vector<Operation> validation_completed(std::uint64_t request_id, double metric,
                                                            const ValidateAfter& op);

  /// Trial `request_id` ended early. Call `trial_closed` for it too once it has ended.
  /// `ConfigError` for an unknown trial or one that exited before.
  LOADSTAR_DECL std::vector<Operation> trial_exited_early(
      std::uint64_t request_id, ExitedReason reason = ExitedReason::errored);

  /// Trial `request_id` has ended (its `Close` done, or after it exited early). Once every trial
  /// asked for has ended, the answer ends with `Shutdown` (`failure` when all failed).
  LOADSTAR_DECL std::vector<Operation> trial_closed(std::uint64_t request_id);

  /// Trial `request_id` has trained `units` (in the searcher's unit) in all; validations report
  /// their operation's length by themselves.
  void set_trial_progress(std::uint64_t request_id, double units) {
    trial_progress_[request_id] = units;
  }

  /// How far the search is, from 0 to 1 (Determined's estimate of each searcher).
  LOADSTAR_DECL double progress() const;

  /// The most trials the searcher keeps running at once: `searcher.max_concurrent_trials`, or
  /// Determined's choice when it is 0 (every trial for `grid` and `random`, per bracket
  /// `max(trials of the last bracket, int(divisor))` for `adaptive_asha`).
  virtual std::uint64_t max_concurrent_trials() const = 0;

  /// Whether the search has shut down.
  bool shutdown() const noexcept { return shutdown_; }

  /// The trials asked for so far.
  std::uint64_t trials_requested() const noexcept { return trials_requested_; }

  /// The last `ValidateAfter` given to trial `request_id` (what a resumed experiment runs it to).
  LOADSTAR_DECL std::optional<ValidateAfter> current_operation(std::uint64_t request_id) const;

  /// Whether trial `request_id` has ended (`trial_closed`).
  bool closed(std::uint64_t request_id) const { return closed_.contains(request_id); }

  /// Everything, as JSON.
  LOADSTAR_DECL nlohmann::json state() const;

  /// Continues from `state()`; `CheckpointError` for a malformed state or one of another
  /// searcher or seed.
  LOADSTAR_DECL void restore(const nlohmann::json& json);

 protected:
  LOADSTAR_DECL Searcher(const ExperimentConfig& config, std::uint32_t experiment_seed);

  const ExperimentConfig& config() const noexcept { return config_; }
  const SearcherConfig& searcher_config() const noexcept { return config_.searcher; }
  const std::map<std::uint64_t, double>& trial_progress() const noexcept { return trial_progress_; }

  /// One random draw of the hyperparameters.
  nlohmann::json sample() { return sample_hparams(config_.hyperparameters, rng_); }

  /// A `Create` with the next request id and a trial seed drawn as Determined draws it,
  /// `uint32(rand.Int64n(1 << 31))`.
  LOADSTAR_DECL Create make_create(nlohmann::json hparams);

  /// `Create`, `ValidateAfter max_length`, `Close` for one trial of `hparams`.
  LOADSTAR_DECL void add_full_trial(std::vector<Operation>& ops, nlohmann::json hparams);

  virtual std::vector<Operation> do_initial_operations() = 0;
  virtual std::vector<Operation> do_validation_completed(std::uint64_t /*request_id*/,
                                                         double /*metric*/) {
    return {};
  }
  virtual std::vector<Operation> do_trial_exited_early(std::uint64_t request_id,
                                                       ExitedReason reason) = 0;
  virtual std::vector<Operation> do_trial_closed(std::uint64_t /*request_id*/) { return {}; }
  virtual double do_progress() const = 0;
  virtual nlohmann::json method_state() const = 0;
  virtual void restore_method(const nlohmann::json& state) = 0;

 private:
  LOADSTAR_DECL void expect_known(std::uint64_t request_id) const;

  LOADSTAR_DECL void record(const std::vector<Operation>& ops);

  LOADSTAR_DECL static std::vector<Operation> operations_from(const nlohmann::json& json);

  ExperimentConfig config_;
  std::uint32_t experiment_seed_;
  SplitMix64 rng_;
  std::uint64_t next_request_id_ = 1;
  std::uint64_t trials_requested_ = 0;
  std::set<std::uint64_t> closed_;
  std::set<std::uint64_t> failures_;
  std::set<std::uint64_t> exits_;
  std::map<std::uint64_t, double> trial_progress_;
  bool shutdown_ = false;
  std::vector<ValidateAfter> completed_;
  std::map<std::uint64_t, ValidateAfter> current_;
};

/// The brackets `adaptive_asha` runs for a searcher config (Determined's `newAdaptiveASHASearch`):
/// for each bracket, most rungs first, its rungs, its trials, the trials it runs at once and the
/// cumulative length each rung validates at.
struct AshaPlan {
  std::vector<std::uint64_t> bracket_rungs;
  std::vector<std::uint64_t> max_trials;
  std::vector<std::uint64_t> max_concurrent_trials;
  std::vector<std::vector<std::uint64_t>> rung_lengths;
};

/// `adaptive_asha`'s brackets: without `bracket_rungs`, `max_rungs` is first cut to
/// `int(log(max_length) / log(divisor)) + 1` and `int(log(max_trials) / log(divisor)) + 1`, then
/// `aggressive` runs one bracket of that many rungs, `standard` the brackets of
/// `(max_rungs-1)/2+1` to `max_rungs` rungs and `conservative` those of 1 to `max_rungs`. Bracket
/// `i` gets `max(int(w_i / sum(w) * max_trials), 1)` trials with `w_i = divisor^(rungs_i-1) /
/// rungs_i`, the remainder going to the first; each runs `max(trials of the last bracket,
/// int(divisor))` trials at once when `max_concurrent_trials` is 0, else an even share of it
/// (the remainder to the first brackets). `ConfigError` for a divisor of at most 1, no trials,
/// or an unknown mode.
LOADSTAR_DECL AshaPlan adaptive_asha_plan(const SearcherConfig& searcher);

namespace detail {

/// `single` and `random` (`random.go`): `max_trials` trials of random hyperparameters (1 for
/// `single`), each trained to `max_length` once, `max_concurrent_trials` at a time (all when 0).
class RandomSearcher final : public Searcher {
 public:
  LOADSTAR_DECL RandomSearcher(const ExperimentConfig& config, std::uint32_t experiment_seed);

  LOADSTAR_DECL std::uint64_t max_concurrent_trials() const override;

 private:
  LOADSTAR_DECL std::vector<Operation> do_initial_operations() override;

  LOADSTAR_DECL std::vector<Operation> do_trial_exited_early(std::uint64_t /*request_id*/,
                                                             ExitedReason reason) override;

  LOADSTAR_DECL std::vector<Operation> do_trial_closed(std::uint64_t /*request_id*/) override;

  LOADSTAR_DECL double do_progress() const override;

  nlohmann::json method_state() const override {
    return {{"created_trials", created_trials_}, {"pending_trials", pending_trials_}};
  }

  LOADSTAR_DECL void restore_method(const nlohmann::json& state) override;

  std::uint64_t max_trials_;
  std::uint64_t created_trials_ = 0;
  std::int64_t pending_trials_ = 0;
};

/// `grid` (`grid.go`): one trial per point of `grid_hparams`, taken from the end of the grid as
/// Determined does, `max_concurrent_trials` at a time (all when 0).
class GridSearcher final : public Searcher {
 public:
  GridSearcher(const ExperimentConfig& config, std::uint32_t experiment_seed)
      : Searcher(config, experiment_seed), grid_(grid_hparams(config.hyperparameters)) {}

  LOADSTAR_DECL std::uint64_t max_concurrent_trials() const override;

 private:
  LOADSTAR_DECL std::vector<Operation> do_initial_operations() override;

  LOADSTAR_DECL void next_point(std::vector<Operation>& ops);

  // Determined replaces a trial that exited early from the rest of the grid, and again when it
  // is closed, whatever the reason.
  LOADSTAR_DECL std::vector<Operation> do_trial_exited_early(std::uint64_t /*request_id*/,
                                                             ExitedReason /*reason*/) override;

  LOADSTAR_DECL std::vector<Operation> do_trial_closed(std::uint64_t /*request_id*/) override;

  LOADSTAR_DECL double do_progress() const override;

  nlohmann::json method_state() const override {
    return {{"pending_trials", pending_trials_},
            {"remaining_trials", remaining_},
            {"trials", grid_.size()}};
  }

  LOADSTAR_DECL void restore_method(const nlohmann::json& state) override;

  std::vector<nlohmann::json> grid_;
  std::vector<nlohmann::json> remaining_;
  std::int64_t pending_trials_ = 0;
};

/// `adaptive_asha` (`adaptive_asha.go`, `tournament.go`): the brackets of `adaptive_asha_plan`,
/// each an `AsyncHalving` (promoting, or with `searcher.stop_once` stopping as
/// `asha_stopping.go` does), the trials of each routed to it.
class AdaptiveAshaSearcher final : public Searcher {
 public:
  LOADSTAR_DECL AdaptiveAshaSearcher(const ExperimentConfig& config, std::uint32_t experiment_seed);

  LOADSTAR_DECL std::uint64_t max_concurrent_trials() const override;

 private:
  /// Runs `event(bracket, create)` on bracket `index`, noting the trials it creates as its own.
  template <class Event>
  std::vector<Operation> in_bracket(std::size_t index, Event&& event) {
    auto create = [this] { return make_create(sample()); };
    std::vector<Operation> ops = event(brackets_[index], create);
    for (const auto& op : ops) {
      if (const auto* created = std::get_if<Create>(&op)) trial_table_[created->request_id] = index;
    }
    return ops;
  }

  LOADSTAR_DECL std::size_t bracket_of(std::uint64_t request_id) const;

  LOADSTAR_DECL std::vector<Operation> do_initial_operations() override;

  LOADSTAR_DECL std::vector<Operation> do_validation_completed(std::uint64_t request_id,
                                                               double metric) override;

  LOADSTAR_DECL std::vector<Operation> do_trial_exited_early(std::uint64_t request_id,
                                                             ExitedReason reason) override;

  LOADSTAR_DECL std::vector<Operation> do_trial_closed(std::uint64_t request_id) override;

  LOADSTAR_DECL double do_progress() const override;

  LOADSTAR_DECL nlohmann::json method_state() const override;

  LOADSTAR_DECL void restore_method(const nlohmann::json& state) override;

  AshaPlan plan_;
  std::vector<AsyncHalving> brackets_;
  std::map<std::uint64_t, std::size_t> trial_table_;
};

}  // namespace detail

/// The searcher `config.searcher.name` names, seeded with `experiment_seed`; `ConfigError` for
/// another name, a `max_length` of 0, no trials, a grid hyperparameter without `count`, a bad
/// `adaptive_asha` mode or divisor.
LOADSTAR_DECL std::unique_ptr<Searcher> make_searcher(const ExperimentConfig& config,
                                                      std::uint32_t experiment_seed);

/// The trials an experiment runs at once: the searcher's `max_concurrent_trials()` (`limit`),
/// and for a `grid` or `random` search whose `searcher.max_concurrent_trials` is 0 (Determined
/// starts every trial: its cluster queues them) no more than the machine's `cores` hold,
/// `max(cores / resources.slots_per_trial, 1)`; with `resources.max_slots` set, for every
/// searcher no more than `max(max_slots / slots_per_trial, 1)`. At least 1.
LOADSTAR_DECL std::uint64_t trials_at_once(const ExperimentConfig& config, std::uint64_t limit,
                                           std::uint64_t cores);

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

std::vector<Operation> Searcher::initial_operations() {
  auto ops = do_initial_operations();
  record(ops);
  return ops;
}

std::vector<Operation> Searcher::validation_completed(std::uint64_t request_id, double metric,
                                                      const ValidateAfter& op) {
  expect_known(request_id);
  if (op.request_id != request_id) {
    throw ConfigError("searcher '" + name() + "': trial request " + std::to_string(request_id) +
                      " reported the operation of request " + std::to_string(op.request_id));
  }
  if (std::find(completed_.begin(), completed_.end(), op) != completed_.end()) {
    throw ConfigError("searcher '" + name() + "': operation " + to_string(Operation{op}) +
                      " was already completed");
  }
  if (std::isnan(metric)) {
    throw ConfigError("searcher '" + name() + "': the searcher metric '" + config_.searcher.metric +
                      "' of trial request " + std::to_string(request_id) + " is NaN");
  }
  auto ops = do_validation_completed(request_id, metric);
  completed_.push_back(op);
  auto& progress = trial_progress_[request_id];
  progress = std::max(progress, static_cast<double>(op.length.value));
  record(ops);
  return ops;
}

std::vector<Operation> Searcher::trial_exited_early(std::uint64_t request_id, ExitedReason reason) {
  expect_known(request_id);
  if (exits_.contains(request_id)) {
    throw ConfigError("searcher '" + name() + "': trial request " + std::to_string(request_id) +
                      " reported an exit twice");
  }
  if (reason == ExitedReason::invalid_hp) trial_progress_.erase(request_id);
  if (reason == ExitedReason::errored) failures_.insert(request_id);
  auto ops = do_trial_exited_early(request_id, reason);
  exits_.insert(request_id);
  record(ops);
  return ops;
}

std::vector<Operation> Searcher::trial_closed(std::uint64_t request_id) {
  expect_known(request_id);
  closed_.insert(request_id);
  auto ops = do_trial_closed(request_id);
  if (trials_requested_ == closed_.size()) {
    ops.push_back(Shutdown{failures_.size() >= trials_requested_});
  }
  record(ops);
  return ops;
}

double Searcher::progress() const {
  const double progress = do_progress();
  return std::isfinite(progress) ? std::clamp(progress, 0.0, 1.0) : 0.0;
}

std::optional<ValidateAfter> Searcher::current_operation(std::uint64_t request_id) const {
  const auto found = current_.find(request_id);
  if (found == current_.end()) return std::nullopt;
  return found->second;
}

nlohmann::json Searcher::state() const {
  nlohmann::json progress = nlohmann::json::object();
  for (const auto& [id, units] : trial_progress_)
    progress[std::to_string(id)] = units;
  nlohmann::json completed = nlohmann::json::array();
  for (const auto& op : completed_)
    completed.push_back(operation_to_json(op));
  nlohmann::json current = nlohmann::json::array();
  for (const auto& [id, op] : current_)
    current.push_back(operation_to_json(op));
  return {{"searcher", name()},
          {"experiment_seed", experiment_seed_},
          {"rng", detail::rng_state(rng_)},
          {"next_request_id", next_request_id_},
          {"trials_requested", trials_requested_},
          {"trials_closed", closed_},
          {"failures", failures_},
          {"exits", exits_},
          {"trial_progress", progress},
          {"shutdown", shutdown_},
          {"completed_operations", completed},
          {"current_operations", current},
          {"method", method_state()}};
}

void Searcher::restore(const nlohmann::json& json) {
  const loadstar::detail::StateReader read("searcher", json);
  const auto searcher = read.get<std::string>("searcher");
  if (searcher != name()) {
    throw CheckpointError("searcher state: saved by searcher '" + searcher +
                          "' but this experiment's searcher is '" + name() + "'");
  }
  const auto seed = read.get<std::uint64_t>("experiment_seed");
  if (seed != experiment_seed_) {
    throw CheckpointError("searcher state: saved with experiment seed " + std::to_string(seed) +
                          " but this experiment's seed is " + std::to_string(experiment_seed_));
  }
  const auto rng = read.get<std::uint64_t>("rng");
  const auto next_request_id = read.get<std::uint64_t>("next_request_id");
  const auto trials_requested = read.get<std::uint64_t>("trials_requested");
  const auto closed = detail::ids_from_json(read.get<nlohmann::json>("trials_closed"),
                                            "searcher state: trials_closed");
  const auto failures =
      detail::ids_from_json(read.get<nlohmann::json>("failures"), "searcher state: failures");
  const auto exits =
      detail::ids_from_json(read.get<nlohmann::json>("exits"), "searcher state: exits");
  const auto progress_json = read.get<nlohmann::json>("trial_progress");
  std::map<std::uint64_t, double> progress;
  if (!progress_json.is_object()) {
    throw CheckpointError("searcher state: trial_progress: expected an object but found " +
                          loadstar::detail::shown(progress_json));
  }
  for (const auto& [key, value] : progress_json.items()) {
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos ||
        !value.is_number()) {
      throw CheckpointError(
          "searcher state: trial_progress: expected request ids to numbers but found " +
          loadstar::detail::shown(progress_json));
    }
    progress[std::stoull(key)] = value.get<double>();
  }
  const auto shutdown = read.get<bool>("shutdown");
  std::vector<ValidateAfter> completed;
  for (const auto& op : operations_from(read.get<nlohmann::json>("completed_operations"))) {
    completed.push_back(std::get<ValidateAfter>(op));
  }
  std::map<std::uint64_t, ValidateAfter> current;
  for (const auto& op : operations_from(read.get<nlohmann::json>("current_operations"))) {
    const auto& validate = std::get<ValidateAfter>(op);
    current[validate.request_id] = validate;
  }
  restore_method(read.get<nlohmann::json>("method"));
  rng_ = SplitMix64(rng);
  next_request_id_ = next_request_id;
  trials_requested_ = trials_requested;
  closed_ = std::set<std::uint64_t>(closed.begin(), closed.end());
  failures_ = std::set<std::uint64_t>(failures.begin(), failures.end());
  exits_ = std::set<std::uint64_t>(exits.begin(), exits.end());
  trial_progress_ = std::move(progress);
  shutdown_ = shutdown;
  completed_ = std::move(completed);
  current_ = std::move(current);
}

Searcher::Searcher(const ExperimentConfig& config, std::uint32_t experiment_seed)
    : config_(config), experiment_seed_(experiment_seed), rng_(experiment_seed) {
  if (config_.searcher.max_length.value == 0) {
    throw ConfigError("searcher '" + name() + "': expected a max_length of at least 1 but found " +
                      length_to_json(config_.searcher.max_length).dump());
  }
}

Create Searcher::make_create(nlohmann::json hparams) {
  const std::uint64_t id = next_request_id_++;
  const auto seed = static_cast<std::uint32_t>(rng_.below(std::uint64_t{1} << 31U));
  return Create{id, std::move(hparams), seed};
}

void Searcher::add_full_trial(std::vector<Operation>& ops, nlohmann::json hparams) {
  Create create = make_create(std::move(hparams));
  const auto id = create.request_id;
  ops.push_back(std::move(create));
  ops.push_back(ValidateAfter{id, config_.searcher.max_length});
  ops.push_back(Close{id});
}

void Searcher::expect_known(std::uint64_t request_id) const {
  if (request_id == 0 || request_id >= next_request_id_) {
    throw ConfigError("searcher '" + name() + "': no trial has request id " +
                      std::to_string(request_id) + " (the requests are 1 to " +
                      std::to_string(next_request_id_ - 1) + ")");
  }
}

void Searcher::record(const std::vector<Operation>& ops) {
  for (const auto& op : ops) {
    if (std::holds_alternative<Create>(op)) ++trials_requested_;
    if (const auto* validate = std::get_if<ValidateAfter>(&op)) {
      current_[validate->request_id] = *validate;
    }
    if (std::holds_alternative<Shutdown>(op)) shutdown_ = true;
  }
}

std::vector<Operation> Searcher::operations_from(const nlohmann::json& json) {
  if (!json.is_array()) {
    throw CheckpointError("searcher state: expected an array of operations but found " +
                          loadstar::detail::shown(json));
  }
  std::vector<Operation> ops;
  for (const auto& op : json) {
    ops.push_back(operation_from_json(op));
    if (!std::holds_alternative<ValidateAfter>(ops.back())) {
      throw CheckpointError("searcher state: expected validate_after operations but found " +
                            loadstar::detail::shown(op));
    }
  }
  return ops;
}

AshaPlan adaptive_asha_plan(const SearcherConfig& searcher) {
  const double divisor = searcher.divisor;
  if (!(divisor > 1)) {
    throw ConfigError("searcher 'adaptive_asha': expected a divisor greater than 1 but found " +
                      std::to_string(divisor));
  }
  if (searcher.max_trials == 0) {
    throw ConfigError("searcher 'adaptive_asha': expected max_trials of at least 1 but found 0");
  }
  if (searcher.max_length.value == 0) {
    throw ConfigError("searcher 'adaptive_asha': expected a max_length of at least 1 but found " +
                      length_to_json(searcher.max_length).dump());
  }
  AshaPlan plan;
  plan.bracket_rungs = searcher.bracket_rungs;
  if (plan.bracket_rungs.empty()) {
    auto max_rungs = static_cast<std::int64_t>(searcher.max_rungs);
    max_rungs = std::min(max_rungs, static_cast<std::int64_t>(
                                        std::log(static_cast<double>(searcher.max_length.value)) /
                                        std::log(divisor)) +
                                        1);
    max_rungs = std::min(
        max_rungs, static_cast<std::int64_t>(std::log(static_cast<double>(searcher.max_trials)) /
                                             std::log(divisor)) +
                       1);
    if (max_rungs < 1) {
      throw ConfigError("searcher 'adaptive_asha': expected max_rungs of at least 1 but found " +
                        std::to_string(searcher.max_rungs));
    }
    const auto rungs = static_cast<std::uint64_t>(max_rungs);
    if (searcher.mode == "aggressive") {
      plan.bracket_rungs = {rungs};
    } else if (searcher.mode == "standard") {
      for (std::uint64_t i = (rungs - 1) / 2 + 1; i <= rungs; ++i)
        plan.bracket_rungs.push_back(i);
    } else if (searcher.mode == "conservative") {
      for (std::uint64_t i = 1; i <= rungs; ++i)
        plan.bracket_rungs.push_back(i);
    } else {
      throw ConfigError(
          "searcher 'adaptive_asha': mode: expected aggressive, standard or conservative but "
          "found '" +
          searcher.mode + "'");
    }
  }
  for (const auto rungs : plan.bracket_rungs) {
    if (rungs == 0) {
      throw ConfigError(
          "searcher 'adaptive_asha': bracket_rungs: expected at least 1 rung per "
          "bracket but found 0");
    }
  }
  std::sort(plan.bracket_rungs.begin(), plan.bracket_rungs.end(), std::greater<>());

  // getBracketMaxTrials.
  std::vector<double> weights;
  double total = 0;
  for (const auto rungs : plan.bracket_rungs) {
    weights.push_back(std::pow(divisor, static_cast<double>(rungs - 1)) /
                      static_cast<double>(rungs));
    total += weights.back();
  }
  std::uint64_t allocated = 0;
  for (const double weight : weights) {
    plan.max_trials.push_back(std::max<std::uint64_t>(
        static_cast<std::uint64_t>(weight / total * static_cast<double>(searcher.max_trials)), 1));
    allocated += plan.max_trials.back();
  }
  if (searcher.max_trials > allocated) plan.max_trials[0] += searcher.max_trials - allocated;

  // getBracketMaxConcurrentTrials.
  const std::uint64_t brackets = plan.bracket_rungs.size();
  std::uint64_t per_bracket = 0;
  std::uint64_t remainder = 0;
  if (searcher.max_concurrent_trials == 0) {
    per_bracket = std::max(plan.max_trials.back(), static_cast<std::uint64_t>(divisor));
  } else {
    const std::uint64_t total_concurrent = std::max(searcher.max_concurrent_trials, brackets);
    per_bracket = total_concurrent / brackets;
    remainder = total_concurrent % brackets;
  }
  plan.max_concurrent_trials.assign(brackets, per_bracket);
  for (std::uint64_t i = 0; i < remainder; ++i)
    ++plan.max_concurrent_trials[i];

  for (std::uint64_t i = 0; i < brackets; ++i) {
    const detail::AsyncHalving bracket(plan.bracket_rungs[i], searcher.max_length,
                                       plan.max_trials[i], divisor, plan.max_concurrent_trials[i],
                                       searcher.smaller_is_better);
    std::vector<std::uint64_t> lengths;
    for (const auto& rung : bracket.rungs())
      lengths.push_back(rung.units_needed);
    // A trial would be asked to train to the same length twice, which Determined's master
    // cannot run either (it trains on without end, then refuses the operation done twice).
    for (std::size_t r = 1; r < lengths.size(); ++r) {
      if (lengths[r] <= lengths[r - 1]) {
        std::string list;
        for (const auto length : lengths)
          list += (list.empty() ? "" : ", ") + std::to_string(length);
        throw ConfigError("searcher 'adaptive_asha': a bracket of " +
                          std::to_string(lengths.size()) + " rungs over max_length " +
                          length_to_json(searcher.max_length).dump() + " validates at [" + list +
                          "]; expected increasing lengths (fewer rungs or a longer max_length)");
      }
    }
    plan.rung_lengths.push_back(std::move(lengths));
  }
  return plan;
}

std::uint64_t trials_at_once(const ExperimentConfig& config, std::uint64_t limit,
                             std::uint64_t cores) {
  std::uint64_t at_once = std::max<std::uint64_t>(limit, 1);
  const std::string& name = config.searcher.name;
  if ((name == "grid" || name == "random") && config.searcher.max_concurrent_trials == 0) {
    const std::uint64_t machine =
        std::max<std::uint64_t>(cores / std::max<std::uint64_t>(config.slots_per_trial, 1), 1);
    at_once = std::min(at_once, machine);
  }
  if (config.max_slots > 0) {
    at_once = std::min(
        at_once, std::max<std::uint64_t>(
                     config.max_slots / std::max<std::uint64_t>(config.slots_per_trial, 1), 1));
  }
  return at_once;
}

std::unique_ptr<Searcher> make_searcher(const ExperimentConfig& config,
                                        std::uint32_t experiment_seed) {
  const auto& name = config.searcher.name;
  if (name == "single" || name == "random") {
    return std::make_unique<detail::RandomSearcher>(config, experiment_seed);
  }
  if (name == "grid") return std::make_unique<detail::GridSearcher>(config, experiment_seed);
  if (name == "adaptive_asha") {
    return std::make_unique<detail::AdaptiveAshaSearcher>(config, experiment_seed);
  }
  throw ConfigError("searcher: expected single, grid, random or adaptive_asha but found '" + name +
                    "'");
}

}  // namespace loadstar::trial
namespace loadstar::trial::detail {

RandomSearcher::RandomSearcher(const ExperimentConfig& config, std::uint32_t experiment_seed)
    : Searcher(config, experiment_seed),
      max_trials_(config.searcher.name == "single" ? 1 : config.searcher.max_trials) {
  if (max_trials_ == 0) {
    throw ConfigError("searcher 'random': expected max_trials of at least 1 but found 0");
  }
}

std::uint64_t RandomSearcher::max_concurrent_trials() const {
  const auto limit = searcher_config().max_concurrent_trials;
  return limit > 0 ? std::min(limit, max_trials_) : max_trials_;
}

std::vector<Operation> RandomSearcher::do_initial_operations() {
  std::vector<Operation> ops;
  for (std::uint64_t i = 0, n = max_concurrent_trials(); i < n; ++i) {
    add_full_trial(ops, sample());
    ++created_trials_;
    ++pending_trials_;
  }
  return ops;
}

std::vector<Operation> RandomSearcher::do_trial_exited_early(std::uint64_t /*request_id*/,
                                                             ExitedReason reason) {
  --pending_trials_;
  std::vector<Operation> ops;
  // As in Determined, a replacement for an invalid trial is not counted in created_trials.
  if (reason == ExitedReason::invalid_hp) {
    add_full_trial(ops, sample());
    ++pending_trials_;
  }
  return ops;
}

std::vector<Operation> RandomSearcher::do_trial_closed(std::uint64_t /*request_id*/) {
  --pending_trials_;
  std::vector<Operation> ops;
  if (created_trials_ < max_trials_) {
    add_full_trial(ops, sample());
    ++created_trials_;
    ++pending_trials_;
  }
  return ops;
}

double RandomSearcher::do_progress() const {
  double units = 0;
  for (const auto& [id, progress] : trial_progress())
    units += progress;
  return units / (static_cast<double>(searcher_config().max_length.value) *
                  static_cast<double>(max_trials_));
}

void RandomSearcher::restore_method(const nlohmann::json& state) {
  const loadstar::detail::StateReader read("searcher '" + name() + "'", state);
  created_trials_ = read.get<std::uint64_t>("created_trials");
  pending_trials_ = read.get<std::int64_t>("pending_trials");
}

std::uint64_t GridSearcher::max_concurrent_trials() const {
  const auto limit = searcher_config().max_concurrent_trials;
  const std::uint64_t trials = grid_.size();
  return limit > 0 ? std::min<std::uint64_t>(limit, trials) : trials;
}

std::vector<Operation> GridSearcher::do_initial_operations() {
  remaining_ = grid_;
  std::vector<Operation> ops;
  if (grid_.empty()) {
    ops.push_back(Shutdown{});
    return ops;
  }
  for (std::uint64_t i = 0, n = max_concurrent_trials(); i < n; ++i)
    next_point(ops);
  return ops;
}

void GridSearcher::next_point(std::vector<Operation>& ops) {
  if (remaining_.empty()) return;
  nlohmann::json hparams = std::move(remaining_.back());
  remaining_.pop_back();
  add_full_trial(ops, std::move(hparams));
  ++pending_trials_;
}

std::vector<Operation> GridSearcher::do_trial_exited_early(std::uint64_t /*request_id*/,
                                                           ExitedReason /*reason*/) {
  --pending_trials_;
  std::vector<Operation> ops;
  next_point(ops);
  return ops;
}

std::vector<Operation> GridSearcher::do_trial_closed(std::uint64_t /*request_id*/) {
  --pending_trials_;
  std::vector<Operation> ops;
  next_point(ops);
  return ops;
}

double GridSearcher::do_progress() const {
  double units = 0;
  for (const auto& [id, progress] : trial_progress())
    units += progress;
  return units / (static_cast<double>(searcher_config().max_length.value) *
                  static_cast<double>(grid_.size()));
}

void GridSearcher::restore_method(const nlohmann::json& state) {
  const loadstar::detail::StateReader read("searcher 'grid'", state);
  const auto trials = read.get<std::uint64_t>("trials");
  if (trials != grid_.size()) {
    throw CheckpointError("searcher 'grid' state: saved for a grid of " + std::to_string(trials) +
                          " points but this config's grid has " + std::to_string(grid_.size()));
  }
  const auto remaining = read.get<nlohmann::json>("remaining_trials");
  if (!remaining.is_array() || remaining.size() > grid_.size()) {
    throw CheckpointError("searcher 'grid' state: expected an array of at most " +
                          std::to_string(grid_.size()) + " remaining points but found " +
                          loadstar::detail::shown(remaining));
  }
  pending_trials_ = read.get<std::int64_t>("pending_trials");
  remaining_ = remaining.get<std::vector<nlohmann::json>>();
}

AdaptiveAshaSearcher::AdaptiveAshaSearcher(const ExperimentConfig& config,
                                           std::uint32_t experiment_seed)
    : Searcher(config, experiment_seed), plan_(adaptive_asha_plan(config.searcher)) {
  for (std::size_t i = 0; i < plan_.bracket_rungs.size(); ++i) {
    brackets_.emplace_back(plan_.bracket_rungs[i], config.searcher.max_length, plan_.max_trials[i],
                           config.searcher.divisor, plan_.max_concurrent_trials[i],
                           config.searcher.smaller_is_better, config.searcher.stop_once);
  }
}

std::uint64_t AdaptiveAshaSearcher::max_concurrent_trials() const {
  std::uint64_t total = 0;
  for (const auto& bracket : brackets_)
    total += bracket.concurrent_trials();
  return total;
}

std::size_t AdaptiveAshaSearcher::bracket_of(std::uint64_t request_id) const {
  const auto found = trial_table_.find(request_id);
  if (found == trial_table_.end()) {
    throw ConfigError("searcher 'adaptive_asha': trial request " + std::to_string(request_id) +
                      " belongs to no bracket");
  }
  return found->second;
}

std::vector<Operation> AdaptiveAshaSearcher::do_initial_operations() {
  std::vector<Operation> ops;
  for (std::size_t i = 0; i < brackets_.size(); ++i) {
    auto bracket_ops = in_bracket(
        i, [](AsyncHalving& bracket, auto& create) { return bracket.initial_operations(create); });
    ops.insert(ops.end(), bracket_ops.begin(), bracket_ops.end());
  }
  return ops;
}

std::vector<Operation> AdaptiveAshaSearcher::do_validation_completed(std::uint64_t request_id,
                                                                     double metric) {
  return in_bracket(bracket_of(request_id), [&](AsyncHalving& bracket, auto& create) {
    return bracket.validation_completed(request_id, metric, create);
  });
}

std::vector<Operation> AdaptiveAshaSearcher::do_trial_exited_early(std::uint64_t request_id,
                                                                   ExitedReason reason) {
  return in_bracket(bracket_of(request_id), [&](AsyncHalving& bracket, auto& create) {
    return bracket.trial_exited_early(request_id, reason == ExitedReason::invalid_hp, create);
  });
}

std::vector<Operation> AdaptiveAshaSearcher::do_trial_closed(std::uint64_t request_id) {
  brackets_[bracket_of(request_id)].trial_closed(request_id);
  return {};
}

double AdaptiveAshaSearcher::do_progress() const {
  double sum = 0;
  for (const auto& bracket : brackets_)
    sum += bracket.progress();
  return sum / static_cast<double>(brackets_.size());
}

nlohmann::json AdaptiveAshaSearcher::method_state() const {
  nlohmann::json table = nlohmann::json::object();
  for (const auto& [id, bracket] : trial_table_)
    table[std::to_string(id)] = bracket;
  nlohmann::json brackets = nlohmann::json::array();
  for (const auto& bracket : brackets_)
    brackets.push_back(bracket.state());
  return {{"trial_table", table}, {"brackets", brackets}};
}

void AdaptiveAshaSearcher::restore_method(const nlohmann::json& state) {
  const std::string owner = "searcher 'adaptive_asha' state";
  const loadstar::detail::StateReader read("searcher 'adaptive_asha'", state);
  auto table = id_map_from_json(read.get<nlohmann::json>("trial_table"), owner + ": trial_table");
  for (const auto& [id, bracket] : table) {
    if (bracket >= brackets_.size()) {
      throw CheckpointError(owner + ": trial request " + std::to_string(id) + " is in bracket " +
                            std::to_string(bracket) + " of " + std::to_string(brackets_.size()));
    }
  }
  const auto brackets = read.get<nlohmann::json>("brackets");
  if (!brackets.is_array() || brackets.size() != brackets_.size()) {
    throw CheckpointError(owner + ": expected " + std::to_string(brackets_.size()) +
                          " brackets but found " + loadstar::detail::shown(brackets));
  }
  auto restored = brackets_;
  for (std::size_t i = 0; i < restored.size(); ++i)
    restored[i].restore(brackets[i]);
  brackets_ = std::move(restored);
  trial_table_.clear();
  for (const auto& [id, bracket] : table)
    trial_table_[id] = static_cast<std::size_t>(bracket);
}

}  // namespace loadstar::trial::detail
#endif
