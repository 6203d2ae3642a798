/// \file
/// `WorkloadSequencer`: turns a searcher's `ValidateAfter` operations into the stream of training,
/// validation and checkpoint workloads a trial runs, with the decision order and the integer
/// arithmetic of Determined's master (`master/internal/trial_workload_sequencer.go@0.15.6`,
/// lengths from `master/pkg/model/length.go@0.15.6`).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/trial/experiment_config.hpp"

namespace loadstar::trial {

/// What a trial does next (Determined's `workload.Kind`).
enum class WorkloadKind { run_step, compute_validation_metrics, checkpoint_model, terminate };

/// One workload, as Determined's master hands it to a trial.
struct Workload {
  WorkloadKind kind = WorkloadKind::terminate;
  /// The step this workload belongs to: a `run_step` opens step `n + 1`, the validations and
  /// checkpoints after it carry `n + 1` too.
  std::uint64_t step_id = 0;
  /// `run_step` only: how many batches to train; 0 otherwise.
  std::uint64_t num_batches = 0;
  /// The batches trained before this workload.
  std::uint64_t total_batches_processed = 0;

  friend bool operator==(const Workload&, const Workload&) = default;
};

/// `"run_step"`, `"compute_validation_metrics"`, `"checkpoint_model"` or `"terminate"`.
LOADSTAR_DECL std::string to_string(WorkloadKind kind);

/// A workload in a short form: `T100@0` (train 100 batches
/// after 0), `V@500`, `C@500`, `X@1687` (terminate); followed by ` step N`.
LOADSTAR_DECL std::string to_string(const Workload& workload);

/// Reads `{"batches": 5}` (or records, epochs); `CheckpointError` naming `owner` otherwise.
LOADSTAR_DECL Length length_from_json(const nlohmann::json& json, const std::string& owner);

/// A length in whole batches, Determined's `ToNearestBatch` (floor): records `r / gbs`, epochs
/// `(e * records_per_epoch) / gbs`. `ConfigError` for a zero batch size or an epoch length without
/// `records_per_epoch`.
LOADSTAR_DECL std::uint64_t to_batches(Length length, std::uint64_t global_batch_size,
                                       std::uint64_t records_per_epoch);

/// `batches` in `unit`, Determined's `UnitsFromBatches`: records `b * gbs`, epochs
/// `b * gbs / records_per_epoch` (fractional), batches `b`.
LOADSTAR_DECL double units_from_batches(Unit unit, std::uint64_t batches,
                                        std::uint64_t global_batch_size,
                                        std::uint64_t records_per_epoch);

/// Whether `batches` batches make `length` within one batch, Determined's `EqualWithinBatch`:
/// batches exactly, records and epochs `|units - batches * gbs| < gbs`.
LOADSTAR_DECL bool equal_within_batch(Length length, std::uint64_t batches,
                                      std::uint64_t global_batch_size,
                                      std::uint64_t records_per_epoch);

/// What the sequencer needs of an experiment configuration and a trial's batch size.
struct SequencerOptions {
  std::uint64_t global_batch_size = 1;
  std::uint64_t records_per_epoch = 0;
  std::uint64_t scheduling_unit = 100;
  /// `{batches: 0}` (any unit with value 0): never.
  Length min_validation_period;
  Length min_checkpoint_period;
  CheckpointPolicy checkpoint_policy = CheckpointPolicy::best;
  bool perform_initial_validation = false;
  /// The unit of `searcher.max_length`, in which `progress()` is reported.
  Unit searcher_unit = Unit::batches;
};

/// The options of a trial of `config` whose `global_batch_size` hyperparameter is
/// `global_batch_size`; `ConfigError` for a zero batch size or scheduling unit, or an epoch length
/// without `records_per_epoch`.
LOADSTAR_DECL SequencerOptions sequencer_options(const ExperimentConfig& config,
                                                 std::uint64_t global_batch_size);

/// Determined's master workload sequencer for one trial. A pull loop drives it:
/// \code
/// WorkloadSequencer sequencer(sequencer_options(config, 32));
/// sequencer.set_operation(config.searcher.max_length);
/// for (auto w = sequencer.next(); w.kind != WorkloadKind::terminate; w = sequencer.next()) {
///   switch (w.kind) {
///     case WorkloadKind::run_step: train(w.num_batches); sequencer.complete(w); break;
///     case WorkloadKind::checkpoint_model: save(sequencer.state_after(w)); sequencer.complete(w);
///                                          break;
///     case WorkloadKind::compute_validation_metrics:
///       sequencer.complete_validation(w, validate_improves()); break;
///     default: break;
///   }
/// }
/// \endcode
/// `next()` decides in Determined's order (first match wins): (1) the initial validation or a due
/// `min_validation_period` validation; (2) a checkpoint when a searcher operation has just ended,
/// after a graceful stop, after a validation that asks for one by `checkpoint_policy`, or at
/// `min_checkpoint_period`; (3) the searcher operation's own validation; (4) train
/// `max(min(left in the operation, until validation, until checkpoint, scheduling_unit), 1)`
/// batches. So an operation ends checkpoint-then-validate, and a period validation is followed by
/// its policy checkpoint. With nothing left to do, a trial checkpoints what is not checkpointed
/// (an operation ending on a period validation) before `terminate`, as Determined's trial does.
class WorkloadSequencer {
 public:
  LOADSTAR_DECL explicit WorkloadSequencer(SequencerOptions options);

  const SequencerOptions& options() const noexcept { return options_; }

  /// Adds a searcher operation: train until the cumulative `length`, then checkpoint and
  /// validate. Setting again the operation already last (as a restarted trial is told its current
  /// operation once more) changes nothing. `ConfigError` for a length not beyond the previous one.
  LOADSTAR_DECL void set_operation(Length length);

  /// Whether every operation is done and validated, or a stop is complete (Determined's
  /// `UpToDate`).
  LOADSTAR_DECL bool up_to_date() const;

  /// The workload to run now. Once `up_to_date()`, a checkpoint of any batch not yet
  /// checkpointed (Determined's trial asks its sequencer for this `PrecloseCheckpointWorkload`
  /// before it ends the trial process), then `terminate`.
  LOADSTAR_DECL Workload next() const;

  /// A `checkpoint_model` of the batches trained so far, whatever comes next (what a paused
  /// trial writes before it exits).
  Workload checkpoint_now() const { return checkpoint(); }

  /// Records a finished `run_step` or `checkpoint_model` (a checkpoint is accepted at any time,
  /// as Determined accepts a pre-close checkpoint). A `terminate` changes nothing.
  LOADSTAR_DECL void complete(const Workload& workload);

  /// Records a finished validation; `best` says whether it improved on the best validation so
  /// far (asks for a checkpoint under policy `best`). Returns whether it was the validation that
  /// ends a searcher operation, whose metric then goes to the searcher.
  LOADSTAR_DECL bool complete_validation(const Workload& workload, bool best);

  /// A graceful stop (the trial set `stop_requested`, or the user cancelled): checkpoint if any
  /// batch is not checkpointed, then terminate. As in Determined, a validation already due at
  /// that moment still runs first.
  LOADSTAR_DECL void request_stop();

  bool stop_requested() const noexcept { return state_.graceful_stop; }

  /// The batches trained so far.
  std::uint64_t total_batches() const noexcept { return state_.total_batches; }

  /// The batches of the current (or, when done, the last) operation; 0 when none was set.
  LOADSTAR_DECL std::uint64_t operation_batches() const;

  /// The step of the last `run_step`.
  std::uint64_t step_id() const noexcept { return state_.cur_step_id; }

  /// The training done, in the searcher's unit (Determined's `Progress`).
  LOADSTAR_DECL double progress() const;

  /// The whole state as JSON (Determined's snapshot fields, the operations and the latest
  /// snapshot).
  LOADSTAR_DECL nlohmann::json state() const;

  /// The state as it will be once `workload` (a checkpoint about to be written) completes: what a
  /// checkpoint stores, so that a trial resumed from it does not checkpoint again.
  LOADSTAR_DECL nlohmann::json state_after(const Workload& workload) const;

  /// Restores `state()`; `CheckpointError` for a malformed state.
  LOADSTAR_DECL void restore(const nlohmann::json& json);

  /// The state Determined rolls back to after a failure: the one after the latest checkpoint (or
  /// after a validation with nothing trained since it).
  nlohmann::json snapshot() const { return to_json(snapshot_); }

  /// Rolls back to `snapshot()` (Determined's `RollBackSequencer`); returns the batches trained
  /// there. Operations added since stay.
  LOADSTAR_DECL std::uint64_t roll_back();

 private:
  struct State {
    std::uint64_t batches_towards_current_op = 0;
    std::uint64_t batches_since_last_validation = 0;
    std::uint64_t batches_since_last_checkpoint = 0;
    std::uint64_t total_batches = 0;
    bool need_initial_validation = false;
    bool need_post_validation_checkpoint = false;
    bool exiting_early = false;
    bool graceful_stop = false;
    std::size_t cur_op_idx = 0;
    std::uint64_t cur_step_id = 0;
    std::vector<Length> ops;
  };

  LOADSTAR_DECL static nlohmann::json to_json(const State& state);

  LOADSTAR_DECL static State from_json(const nlohmann::json& json);

  std::uint64_t batches_of(Length length) const {
    return to_batches(length, options_.global_batch_size, options_.records_per_epoch);
  }

  bool within_batch(Length length, std::uint64_t batches) const {
    return equal_within_batch(length, batches, options_.global_batch_size,
                              options_.records_per_epoch);
  }

  LOADSTAR_DECL void expect_next(const Workload& workload) const;

  LOADSTAR_DECL void run_step_completed(std::uint64_t batches);

  LOADSTAR_DECL void checkpoint_completed();

  void take_snapshot() { snapshot_ = state_; }

  /// An operation has just ended without its validation.
  bool has_searcher_validation() const {
    return state_.batches_towards_current_op == 0 && state_.batches_since_last_validation != 0;
  }

  // A period shorter than one batch (0 after the floor) would otherwise be "due" with nothing
  // trained since the last one and repeat forever; Determined's arithmetic is kept otherwise.
  LOADSTAR_DECL bool min_validation_needed() const;

  LOADSTAR_DECL bool min_checkpoint_needed() const;

  LOADSTAR_DECL std::int64_t batches_until_validation() const;

  LOADSTAR_DECL std::int64_t batches_until_checkpoint() const;

  bool post_graceful_stop_checkpoint_needed() const {
    return state_.graceful_stop && state_.batches_since_last_checkpoint != 0;
  }

  bool post_validation_checkpoint_needed() const {
    return state_.need_post_validation_checkpoint && state_.batches_since_last_checkpoint != 0;
  }

  Workload validate() const {
    return Workload{WorkloadKind::compute_validation_metrics, state_.cur_step_id, 0,
                    state_.total_batches};
  }

  Workload checkpoint() const {
    return Workload{WorkloadKind::checkpoint_model, state_.cur_step_id, 0, state_.total_batches};
  }

  SequencerOptions options_;
  State state_;
  State snapshot_;
};

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

std::string to_string(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::run_step:
      return "run_step";
    case WorkloadKind::compute_validation_metrics:
      return "compute_validation_metrics";
    case WorkloadKind::checkpoint_model:
      return "checkpoint_model";
    case WorkloadKind::terminate:
      return "terminate";
  }
  return "unknown";
}

std::string to_string(const Workload& workload) {
  std::string text;
  switch (workload.kind) {
    case WorkloadKind::run_step:
      text = "T" + std::to_string(workload.num_batches);
      break;
    case WorkloadKind::compute_validation_metrics:
      text = "V";
      break;
    case WorkloadKind::checkpoint_model:
      text = "C";
      break;
    case WorkloadKind::terminate:
      text = "X";
      break;
  }
  return text + "@" + std::to_string(workload.total_batches_processed) + " step " +
         std::to_string(workload.step_id);
}

Length length_from_json(const nlohmann::json& json, const std::string& owner) {
  if (!json.is_object() || json.size() != 1) {
    throw CheckpointError(owner + ": expected a length like {\"batches\": 5} but found " +
                          loadstar::detail::shown(json));
  }
  const auto& key = json.begin().key();
  const auto& value = json.begin().value();
  if (key != "batches" && key != "records" && key != "epochs") {
    throw CheckpointError(owner + ": expected a length in batches, records or epochs but found " +
                          loadstar::detail::shown(json));
  }
  // JSON built in C++ from an int is signed even when non-negative.
  if (!value.is_number_unsigned() &&
      !(value.is_number_integer() && value.get<std::int64_t>() >= 0)) {
    throw CheckpointError(owner + ": expected a non-negative integer length but found " +
                          loadstar::detail::shown(json));
  }
  const auto units = value.get<std::uint64_t>();
  if (key == "batches") return Length{Unit::batches, units};
  if (key == "records") return Length{Unit::records, units};
  return Length{Unit::epochs, units};
}

std::uint64_t to_batches(Length length, std::uint64_t global_batch_size,
                         std::uint64_t records_per_epoch) {
  if (global_batch_size == 0) {
    throw ConfigError("length " + length_to_json(length).dump() +
                      ": expected a global batch size of at least 1 but found 0");
  }
  switch (length.unit) {
    case Unit::batches:
      return length.value;
    case Unit::records:
      return length.value / global_batch_size;
    case Unit::epochs:
      if (records_per_epoch == 0) {
        throw ConfigError("length " + length_to_json(length).dump() +
                          ": a length in epochs needs records_per_epoch but it is not set");
      }
      return length.value * records_per_epoch / global_batch_size;
  }
  return 0;
}

double units_from_batches(Unit unit, std::uint64_t batches, std::uint64_t global_batch_size,
                          std::uint64_t records_per_epoch) {
  switch (unit) {
    case Unit::batches:
      return static_cast<double>(batches);
    case Unit::records:
      return static_cast<double>(batches * global_batch_size);
    case Unit::epochs:
      if (records_per_epoch == 0) {
        throw ConfigError(
            "progress in epochs: a length in epochs needs records_per_epoch but it is not set");
      }
      return static_cast<double>(batches * global_batch_size) /
             static_cast<double>(records_per_epoch);
  }
  return 0;
}

bool equal_within_batch(Length length, std::uint64_t batches, std::uint64_t global_batch_size,
                        std::uint64_t records_per_epoch) {
  const auto distance = [&](std::uint64_t units) {
    const std::uint64_t records = batches * global_batch_size;
    return units > records ? units - records : records - units;
  };
  switch (length.unit) {
    case Unit::batches:
      return length.value == batches;
    case Unit::records:
      return distance(length.value) < global_batch_size;
    case Unit::epochs:
      return distance(length.value * records_per_epoch) < global_batch_size;
  }
  return false;
}

SequencerOptions sequencer_options(const ExperimentConfig& config,
                                   std::uint64_t global_batch_size) {
  if (global_batch_size == 0) {
    throw ConfigError("workload sequencer: expected a global_batch_size of at least 1 but found 0");
  }
  if (config.scheduling_unit == 0) {
    throw ConfigError("workload sequencer: expected a scheduling_unit of at least 1 but found 0");
  }
  SequencerOptions options;
  options.global_batch_size = global_batch_size;
  options.records_per_epoch = config.records_per_epoch;
  options.scheduling_unit = config.scheduling_unit;
  options.min_validation_period = config.min_validation_period;
  options.min_checkpoint_period = config.min_checkpoint_period;
  options.checkpoint_policy = config.checkpoint_policy;
  options.perform_initial_validation = config.perform_initial_validation;
  options.searcher_unit = config.searcher.max_length.unit;
  for (const Length& length :
       {options.min_validation_period, options.min_checkpoint_period, config.searcher.max_length}) {
    if (length.value != 0) (void)to_batches(length, global_batch_size, config.records_per_epoch);
  }
  return options;
}

WorkloadSequencer::WorkloadSequencer(SequencerOptions options) : options_(options) {
  if (options_.global_batch_size == 0) {
    throw ConfigError("workload sequencer: expected a global_batch_size of at least 1 but found 0");
  }
  if (options_.scheduling_unit == 0) {
    throw ConfigError("workload sequencer: expected a scheduling_unit of at least 1 but found 0");
  }
  state_.need_initial_validation = options_.perform_initial_validation;
  snapshot_ = state_;
}

void WorkloadSequencer::set_operation(Length length) {
  if (!state_.ops.empty() && state_.ops.back() == length) return;
  const std::uint64_t batches = batches_of(length);
  const std::uint64_t floor =
      std::max(state_.total_batches, state_.ops.empty() ? 0 : batches_of(state_.ops.back()));
  if (batches <= floor) {
    throw ConfigError("workload sequencer: operation " + length_to_json(length).dump() + " is " +
                      std::to_string(batches) + " batches but expected more than " +
                      std::to_string(floor) + " (the batches trained or asked for before)");
  }
  state_.ops.push_back(length);
}

bool WorkloadSequencer::up_to_date() const {
  return (state_.ops.size() <= state_.cur_op_idx && !has_searcher_validation()) ||
         (state_.exiting_early && !post_graceful_stop_checkpoint_needed());
}

Workload WorkloadSequencer::next() const {
  if (up_to_date()) {
    if (state_.batches_since_last_checkpoint != 0) return checkpoint();
    return Workload{WorkloadKind::terminate, state_.cur_step_id, 0, state_.total_batches};
  }
  if (state_.need_initial_validation || min_validation_needed()) return validate();
  if ((has_searcher_validation() && state_.batches_since_last_checkpoint != 0) ||
      post_graceful_stop_checkpoint_needed() || post_validation_checkpoint_needed() ||
      min_checkpoint_needed()) {
    return checkpoint();
  }
  if (has_searcher_validation()) return validate();
  // Signed, as in Go: a period already overshot (a zero-batch period) gives 1 batch.
  const auto left = static_cast<std::int64_t>(batches_of(state_.ops[state_.cur_op_idx])) -
                    static_cast<std::int64_t>(state_.total_batches);
  const std::int64_t batches =
      std::max<std::int64_t>(std::min({left, batches_until_validation(), batches_until_checkpoint(),
                                       static_cast<std::int64_t>(options_.scheduling_unit)}),
                             1);
  return Workload{WorkloadKind::run_step, state_.cur_step_id + 1,
                  static_cast<std::uint64_t>(batches), state_.total_batches};
}

void WorkloadSequencer::complete(const Workload& workload) {
  switch (workload.kind) {
    case WorkloadKind::run_step:
      expect_next(workload);
      run_step_completed(workload.num_batches);
      break;
    case WorkloadKind::checkpoint_model:
      checkpoint_completed();
      break;
    case WorkloadKind::compute_validation_metrics:
      LOADSTAR_ASSERT(false, "a validation is completed with complete_validation");
      break;
    case WorkloadKind::terminate:
      break;
  }
}

bool WorkloadSequencer::complete_validation(const Workload& workload, bool best) {
  LOADSTAR_ASSERT(workload.kind == WorkloadKind::compute_validation_metrics,
                  "complete_validation takes a compute_validation_metrics workload");
  expect_next(workload);
  const bool had_searcher_validation = has_searcher_validation();
  state_.batches_since_last_validation = 0;
  state_.need_initial_validation = false;
  if (state_.batches_since_last_checkpoint != 0) {
    if (options_.checkpoint_policy == CheckpointPolicy::all ||
        (options_.checkpoint_policy == CheckpointPolicy::best && best)) {
      state_.need_post_validation_checkpoint = true;
    }
  }
  if (state_.batches_since_last_checkpoint == 0) take_snapshot();
  return had_searcher_validation;
}

void WorkloadSequencer::request_stop() {
  state_.graceful_stop = true;
  state_.exiting_early = true;
}

std::uint64_t WorkloadSequencer::operation_batches() const {
  if (state_.ops.empty()) return 0;
  return batches_of(state_.ops[std::min<std::size_t>(state_.cur_op_idx, state_.ops.size() - 1)]);
}

double WorkloadSequencer::progress() const {
  return units_from_batches(options_.searcher_unit, state_.total_batches,
                            options_.global_batch_size, options_.records_per_epoch);
}

nlohmann::json WorkloadSequencer::state() const {
  auto json = to_json(state_);
  json["latest_snapshot"] = to_json(snapshot_);
  return json;
}

nlohmann::json WorkloadSequencer::state_after(const Workload& workload) const {
  WorkloadSequencer after = *this;
  after.complete(workload);
  return after.state();
}

void WorkloadSequencer::restore(const nlohmann::json& json) {
  const loadstar::detail::StateReader read("workload sequencer", json);
  State state = from_json(json);
  if (json.contains("latest_snapshot")) {
    snapshot_ = from_json(read.get<nlohmann::json>("latest_snapshot"));
  } else {
    snapshot_ = state;
  }
  state_ = std::move(state);
}

std::uint64_t WorkloadSequencer::roll_back() {
  auto ops = state_.ops;
  state_ = snapshot_;
  if (ops.size() > state_.ops.size()) state_.ops = std::move(ops);
  return state_.total_batches;
}

nlohmann::json WorkloadSequencer::to_json(const State& state) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& op : state.ops)
    ops.push_back(length_to_json(op));
  return {{"batches_towards_current_op", state.batches_towards_current_op},
          {"batches_since_last_val", state.batches_since_last_validation},
          {"batches_since_last_chkp", state.batches_since_last_checkpoint},
          {"total_batches_processed", state.total_batches},
          {"need_initial_validation", state.need_initial_validation},
          {"need_post_validation_ckpt", state.need_post_validation_checkpoint},
          {"exiting_early", state.exiting_early},
          {"graceful_stop", state.graceful_stop},
          {"cur_op_idx", state.cur_op_idx},
          {"cur_step_id", state.cur_step_id},
          {"ops", ops}};
}

auto WorkloadSequencer::from_json(const nlohmann::json& json) -> State {
  const loadstar::detail::StateReader read("workload sequencer", json);
  State state;
  state.batches_towards_current_op = read.get<std::uint64_t>("batches_towards_current_op");
  state.batches_since_last_validation = read.get<std::uint64_t>("batches_since_last_val");
  state.batches_since_last_checkpoint = read.get<std::uint64_t>("batches_since_last_chkp");
  state.total_batches = read.get<std::uint64_t>("total_batches_processed");
  state.need_initial_validation = read.get<bool>("need_initial_validation");
  state.need_post_validation_checkpoint = read.get<bool>("need_post_validation_ckpt");
  state.exiting_early = read.get<bool>("exiting_early");
  state.graceful_stop = read.get<bool>("graceful_stop");
  state.cur_op_idx = read.get<std::uint64_t>("cur_op_idx");
  state.cur_step_id = read.get<std::uint64_t>("cur_step_id");
  const auto ops = read.get<nlohmann::json>("ops");
  if (!ops.is_array()) {
    throw CheckpointError("workload sequencer state: the field 'ops' should be an array but is " +
                          loadstar::detail::shown(ops));
  }
  for (const auto& op : ops) {
    state.ops.push_back(length_from_json(op, "workload sequencer state: ops"));
  }
  if (state.cur_op_idx > state.ops.size()) {
    throw CheckpointError("workload sequencer state: cur_op_idx " +
                          std::to_string(state.cur_op_idx) + " is beyond the " +
                          std::to_string(state.ops.size()) + " operations");
  }
  return state;
}

void WorkloadSequencer::expect_next(const Workload& workload) const {
  LOADSTAR_ASSERT(workload == next(), "the completed workload is not the one next() gave");
  (void)workload;
}

void WorkloadSequencer::run_step_completed(std::uint64_t batches) {
  ++state_.cur_step_id;
  state_.total_batches += batches;
  state_.batches_towards_current_op += batches;
  state_.batches_since_last_validation += batches;
  state_.batches_since_last_checkpoint += batches;
  if (within_batch(state_.ops[state_.cur_op_idx], state_.total_batches)) {
    ++state_.cur_op_idx;
    state_.batches_towards_current_op = 0;
  }
}

void WorkloadSequencer::checkpoint_completed() {
  state_.batches_since_last_checkpoint = 0;
  state_.need_post_validation_checkpoint = false;
  take_snapshot();
}

bool WorkloadSequencer::min_validation_needed() const {
  return options_.min_validation_period.value != 0 && state_.batches_since_last_validation != 0 &&
         within_batch(options_.min_validation_period, state_.batches_since_last_validation);
}

bool WorkloadSequencer::min_checkpoint_needed() const {
  return options_.min_checkpoint_period.value != 0 && state_.batches_since_last_checkpoint != 0 &&
         within_batch(options_.min_checkpoint_period, state_.batches_since_last_checkpoint);
}

std::int64_t WorkloadSequencer::batches_until_validation() const {
  if (options_.min_validation_period.value == 0) return std::numeric_limits<std::int32_t>::max();
  return static_cast<std::int64_t>(batches_of(options_.min_validation_period)) -
         static_cast<std::int64_t>(state_.batches_since_last_validation);
}

std::int64_t WorkloadSequencer::batches_until_checkpoint() const {
  if (options_.min_checkpoint_period.value == 0) return std::numeric_limits<std::int32_t>::max();
  return static_cast<std::int64_t>(batches_of(options_.min_checkpoint_period)) -
         static_cast<std::int64_t>(state_.batches_since_last_checkpoint);
}

}  // namespace loadstar::trial
#endif
