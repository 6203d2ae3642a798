/// \file
/// `TrialController`: runs one trial's workloads on a built model and its loaders, writes its
/// metrics, checkpoints and record, and resumes it from its latest checkpoint (the pull-style
/// equivalent of Determined's `TFKerasTrialController` in
/// harness/determined/keras/_tf_keras_trial.py, which drives `fit` from inside its callbacks).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/dist/collective.hpp"
#include "loadstar/dist/state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/backup_and_restore.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/states.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/trial/callback.hpp"
#include "loadstar/trial/checkpoint.hpp"
#include "loadstar/trial/data_loader.hpp"
#include "loadstar/trial/detail/interruption.hpp"
#include "loadstar/trial/detail/trial_files.hpp"
#include "loadstar/trial/detail/trial_tensorboard.hpp"
#include "loadstar/trial/trial_context.hpp"
#include "loadstar/trial/trial_spec.hpp"
#include "loadstar/trial/workload_sequencer.hpp"

namespace loadstar::trial {

namespace detail {

/// Determined's `--test` overrides (its local test mode): `make_test_config`, idempotent, so an
/// experiment that applied it already may pass `test` too.
inline ExperimentConfig test_overrides(ExperimentConfig config) {
  return make_test_config(std::move(config));
}

/// Logs as `[[name, value], ...]`, in their order (a JSON object would sort the names).
inline nlohmann::json logs_json(const keras::Logs& logs) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [name, value] : logs)
    list.push_back({name, value});
  return list;
}

/// The logs `logs_json` wrote; `CheckpointError` naming `owner` when `json` is not such a list.
inline keras::Logs logs_from_json(const nlohmann::json& json, const std::string& owner) {
  keras::Logs logs;
  const auto pair = [](const nlohmann::json& e) {
    return e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number();
  };
  if (!json.is_array() || !std::all_of(json.begin(), json.end(), pair)) {
    throw CheckpointError(owner + ": expected a list of [name, value] pairs but found " +
                          json.dump());
  }
  for (const auto& e : json)
    logs.set(e[0].get<std::string>(), e[1].get<double>());
  return logs;
}

class TrialController {
 public:
  LOADSTAR_DECL TrialController(const TrialSpec& spec, const RunOptions& options,
                                TrialContext& context, keras::Model& model,
                                const DataLoader& training, const DataLoader& validation,
                                std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks);

  /// Runs the workloads until the sequencer terminates; `record` is `trial.json` as it stands
  /// (the restart count already set), updated in place. `reached`, when given, follows the
  /// batches trained, so that a failure's batch is known after the controller is gone.
  LOADSTAR_DECL TrialResult run(TrialJson& record, std::uint64_t* reached = nullptr);

 private:
  std::string owner() const { return "trial " + std::to_string(spec_.trial_id); }

  bool distributed() const noexcept { return collective_.size() > 1; }

  /// A stop requested on any rank (a callback's `stop_training`) stops every rank, so that the
  /// ranks run the same workloads.
  LOADSTAR_DECL void agree_on_stop();

  /// Whether a SIGTERM or SIGINT asked this process (or, distributed, any rank) to pause.
  LOADSTAR_DECL bool pause_requested();

  // --- resume ---------------------------------------------------------------------------------

  /// Determined's restore order after a crash: weights and optimizer, the random state,
  /// the callbacks' states, the sequencer, the data position; metrics after the checkpoint are
  /// dropped, to be produced again.
  LOADSTAR_DECL void resume();

  /// Removes this trial's checkpoint folders that its record does not list: those a killed run
  /// renamed into place but did not record, and those it was writing (`<uuid>.tmp`, and the
  /// staging folder a write starts in). A folder is this trial's when its metadata names this
  /// experiment and trial, or, for a staging folder, its name does (the folder is shared with the
  /// experiment's other trials).
  LOADSTAR_DECL void remove_orphans() const;
  /// Removes this trial's checkpoint folder `path` (of checkpoint `uuid`): renamed first to its
  /// staging name, which `remove_orphans` knows by the name alone, so that a kill in the middle
  /// of the removal (the metadata perhaps gone already) leaves nothing a later start misses.
  LOADSTAR_DECL void discard_checkpoint(const std::filesystem::path& path,
                                        const std::string& uuid) const;

  // --- training -------------------------------------------------------------------------------

  LOADSTAR_DECL const keras::BatchView& next_batch();

  LOADSTAR_DECL void check_stop_training();

  /// Trains workload `w` (from the batch a mid-workload checkpoint reached, when it is that
  /// workload's). Returns the batches of `w` trained when a pause or a kill stopped it between
  /// two of them (one process: a scheduler's signal is answered at the next batch boundary; the
  /// ranks of a distributed trial stop together at workload boundaries), else none.
  LOADSTAR_DECL std::optional<std::uint64_t> train(const Workload& w);

  /// The synthesized `on_epoch_end` of the epoch that ended last, with the logs a Keras user
  /// expects: that epoch's latest training metrics and the latest validation metrics (`val_`).
  /// An epoch that ends on a workload's last batch waits for the next workload: a validation at
  /// the same batch goes first (as `fit` validates before `on_epoch_end`); anything else after.
  LOADSTAR_DECL void end_epoch();

  // --- validation -----------------------------------------------------------------------------

  LOADSTAR_DECL double validate(const Workload& w);

  /// The searcher's metric among the validation logs (`val_loss`, or `loss` meaning `val_loss`);
  /// `ConfigError` naming the metrics found when it is missing, `Error` when it is NaN.
  LOADSTAR_DECL double searcher_metric(const keras::Logs& logs) const;

  // --- checkpoints ----------------------------------------------------------------------------

  LOADSTAR_DECL nlohmann::json units(std::uint64_t batches) const;

  /// Checkpoints at workload `w` (a checkpoint workload). A `pause` checkpoint leaves the
  /// sequencer as it is, so that a resume runs the workloads an uninterrupted run runs; with
  /// `partial`, it is taken inside run_step workload `w` after `partial` of its batches, and a
  /// resume trains `w`'s other batches.
  LOADSTAR_DECL void checkpoint(const Workload& w, bool pause = false,
                                std::optional<std::uint64_t> partial = std::nullopt);

  /// `save_trial_latest` and `save_trial_best`: which checkpoints stay listed. While the trial
  /// may go on, its latest checkpoint always stays (a resume needs it).
  LOADSTAR_DECL void apply_retention(bool done);

  /// Removes the folders of checkpoints the record no longer lists (after the record is written,
  /// so that a kill in between leaves the record's checkpoints in place).
  LOADSTAR_DECL void remove_unlisted();

  // --- output ---------------------------------------------------------------------------------

  LOADSTAR_DECL nlohmann::json metrics_line(const char* kind, std::uint64_t step_id,
                                            std::uint64_t batches, const keras::Logs& logs) const;

  LOADSTAR_DECL static std::string describe(const keras::Logs& logs);

  /// Rank 0 alone prints.
  bool verbose() const { return chief_ && options_.verbose && fit_.verbose; }

  /// Keras's progress bar for the training (verbose only): one bar per epoch of
  /// `records_per_epoch` records ("Epoch 3/5"), or per training workload without it.
  LOADSTAR_DECL void start_bar();

  /// Ends a progress bar line that a workload line would otherwise continue (mid-epoch, on a
  /// terminal).
  void end_bar_line() const {
    if (bar_ && batches_per_epoch_ != 0 && epoch_batches_ != 0 && out_ == &std::cout &&
        ::isatty(STDOUT_FILENO)) {
      *out_ << "\n";
    }
  }

  const TrialSpec& spec_;
  const RunOptions& options_;
  TrialContext& context_;
  const ExperimentConfig& config_;
  keras::Model& model_;
  const DataLoader& validation_;
  std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks_;
  /// `callbacks_` called as one, bound to the model by `run`.
  CallbackList list_;
  dist::Collective& collective_;
  bool chief_ = true;
  /// The `configure_fit` settings and the data options as the trial left them when it was built.
  FitSettings fit_;
  keras::DataIteratorOptions data_options_;
  keras::DataIterator data_;
  std::size_t data_epoch_ = 0;
  bool data_started_ = false;
  WorkloadSequencer sequencer_;
  MetricsFile metrics_;
  /// The TensorBoard events of `metrics_`'s lines (rank 0 alone writes both).
  TrialTensorBoard tensorboard_;
  std::ostream* out_;
  TrialJson* record_ = nullptr;
  std::optional<double> best_;
  std::optional<std::pair<std::uint64_t, double>> last_validation_;
  /// The run_step workload a mid-workload checkpoint stopped in (its step id) and the batches of
  /// it trained: where `train` continues after a resume.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> partial_workload_;
  std::uint64_t batches_per_epoch_ = 0;
  std::uint64_t epoch_ = 0;
  std::uint64_t epoch_batches_ = 0;
  bool want_epoch_begin_ = true;
  /// The epoch whose `on_epoch_end` waits for `end_epoch`, with its training logs.
  std::optional<std::uint64_t> pending_epoch_end_;
  keras::Logs pending_epoch_logs_;
  /// The latest validation's logs (`val_` names), kept in checkpoints for the epoch ends.
  keras::Logs validation_logs_;
  std::uint64_t* reached_ = nullptr;
  std::vector<std::string> removed_;
  std::unique_ptr<keras::callbacks::ProgbarLogger> bar_;
};

}  // namespace detail
}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

TrialController::TrialController(const TrialSpec& spec, const RunOptions& options,
                                 TrialContext& context, keras::Model& model,
                                 const DataLoader& training, const DataLoader& validation,
                                 std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks)
    : spec_(spec),
      options_(options),
      context_(context),
      config_(context.get_experiment_config()),
      model_(model),
      validation_(validation),
      callbacks_(std::move(callbacks)),
      collective_(*context.collective()),
      chief_(context.distributed.is_chief()),
      fit_(context.fit_settings()),
      data_options_(context.data_options()),
      data_(training.training(data_options_,
                              "trial " + std::to_string(spec.trial_id) + ": training data loader")),
      sequencer_(sequencer_options(config_, context.get_global_batch_size())),
      metrics_(spec.trial_dir / "metrics.jsonl"),
      tensorboard_(spec.trial_dir / "tensorboard"),
      out_(options.output ? options.output : &std::cout) {
  if (validation_.empty()) {
    throw ConfigError("trial " + std::to_string(spec.trial_id) +
                      ": validation data loader: expected (x, y), (x, y, sample_weights), a "
                      "Sequence, a Dataset or a SequenceAdapter but found an empty data loader");
  }
  if (!model_.compiled()) {
    throw ConfigError("trial " + std::to_string(spec.trial_id) +
                      ": build_model must return a compiled model but model '" + model_.name() +
                      "' is not compiled");
  }
  const std::uint64_t gbs = context.get_global_batch_size();
  batches_per_epoch_ = config_.records_per_epoch / gbs;
}

TrialResult TrialController::run(TrialJson& record, std::uint64_t* reached) {
  record_ = &record;
  reached_ = reached;
  resume();
  if (reached_) *reached_ = sequencer_.total_batches();
  if (chief_) {
    tensorboard_.open(sequencer_.total_batches(), metrics_.path(), context_.get_hparams(),
                      config_.searcher.metric.empty() ? "val_loss" : config_.searcher.metric);
  }
  if (distributed()) {
    // Every rank starts from rank 0's weights and optimizer state (after a resume they are
    // the same already; before the first step the initial weights may differ).
    dist::broadcast_state(model_, collective_);
  }
  if (chief_) remove_orphans();
  sequencer_.set_operation(options_.until ? *options_.until : config_.searcher.max_length);
  list_ = CallbackList(callbacks_, model_,
                       {.verbose = 0, .epochs = 1, .steps = std::nullopt, .output = out_});
  list_.on_train_begin();
  start_bar();
  TrialResult result;
  // The batches of the workload a pause or a kill stopped inside, beyond the sequencer's count.
  std::uint64_t trained_inside = 0;
  for (;;) {
    Workload w = sequencer_.next();
    if (pending_epoch_end_ && w.kind != WorkloadKind::compute_validation_metrics) {
      end_epoch();
      if (distributed()) agree_on_stop();
      if (context_.get_stop_requested() && !sequencer_.stop_requested()) {
        sequencer_.request_stop();
        w = sequencer_.next();
      }
    }
    if (w.kind == WorkloadKind::terminate) {
      // Determined's pre-close checkpoint (the master sequencer's): batches trained since the
      // last checkpoint are checkpointed before the trial exits (an operation whose end was
      // validated by a period validation), so that a later operation continues from here.
      if (sequencer_.state().value("batches_since_last_chkp", std::uint64_t{0}) == 0) break;
      w.kind = WorkloadKind::checkpoint_model;
    }
    bool stopped_inside = false;
    switch (w.kind) {
      case WorkloadKind::run_step:
        if (const auto trained = train(w)) {
          // A pause (checkpoint, then exit) or a kill (exit) between two batches.
          if (interruption() == interruption_pause) checkpoint(w, true, *trained);
          trained_inside = *trained;
          stopped_inside = true;
          break;
        }
        sequencer_.complete(w);
        break;
      case WorkloadKind::compute_validation_metrics: {
        const double metric = validate(w);
        const bool improved =
            !best_ || (config_.searcher.smaller_is_better ? metric < *best_ : metric > *best_);
        if (improved) best_ = metric;
        if (sequencer_.complete_validation(w, improved)) result.searcher_metric = metric;
        end_epoch();
        break;
      }
      case WorkloadKind::checkpoint_model:
        checkpoint(w);
        break;
      case WorkloadKind::terminate:
        break;
    }
    if (stopped_inside) {
      result.paused = true;
      break;
    }
    if (distributed()) agree_on_stop();
    if (context_.get_stop_requested() && !sequencer_.stop_requested()) {
      sequencer_.request_stop();
    }
    // An operation that has reported its validation, or has nothing left, ends as it is.
    if (result.searcher_metric || sequencer_.next().kind == WorkloadKind::terminate) continue;
    if (!distributed() && interruption() == interruption_kill) {
      // `experiment kill`: no checkpoint; the trial's record stays where its last one left it.
      result.paused = true;
      break;
    }
    if (pause_requested()) {
      // A pause: the batches trained since the last checkpoint are checkpointed, then the trial
      // exits; a later run continues from here as if nothing had happened.
      if (sequencer_.state().value("batches_since_last_chkp", std::uint64_t{0}) != 0) {
        checkpoint(sequencer_.checkpoint_now(), true);
      }
      result.paused = true;
      break;
    }
  }
  list_.on_train_end();

  record.total_batches = sequencer_.total_batches() + trained_inside;
  const std::uint64_t max_batches = to_batches(
      config_.searcher.max_length, context_.get_global_batch_size(), config_.records_per_epoch);
  const bool done =
      !result.paused && (sequencer_.stop_requested() || sequencer_.total_batches() >= max_batches);
  record.state = done ? "COMPLETED" : "ACTIVE";
  apply_retention(done);
  if (chief_) write_trial_record(spec_.trial_dir, record);
  remove_unlisted();  // the folders the final retention dropped, as after every checkpoint

  result.total_batches = sequencer_.total_batches() + trained_inside;
  result.stop_requested = sequencer_.stop_requested();
  result.latest_checkpoint = record.latest_checkpoint;
  result.best_checkpoint = record.best_checkpoint;
  result.restarts = record.restarts;
  return result;
}

bool TrialController::pause_requested() {
  bool pause = interruption() == interruption_pause;
  if (distributed()) {
    // Every rank pauses at the same workload boundary, if any rank was asked to.
    const auto flags = collective_.allgather(pause ? 1 : 0);
    pause = std::any_of(flags.begin(), flags.end(), [](std::uint64_t f) { return f != 0; });
  }
  return pause;
}

void TrialController::agree_on_stop() {
  const auto flags = collective_.allgather(context_.get_stop_requested() ? 1 : 0);
  if (std::any_of(flags.begin(), flags.end(), [](std::uint64_t f) { return f != 0; })) {
    context_.set_stop_requested(true);
  }
}

void TrialController::resume() {
  if (record_->latest_checkpoint.empty()) {
    if (chief_) metrics_.keep(0);
    if (!spec_.warm_start.empty()) {
      // Determined's warm start: the source checkpoint's weights and optimizer state; the trial
      // otherwise starts afresh.
      load_checkpoint_model(model_, spec_.warm_start);
      if (verbose()) {
        end_bar_line();
        *out_ << owner() << ": starting from the weights of checkpoint "
              << spec_.warm_start.string() << "\n";
      }
    }
    return;
  }
  const auto path = spec_.checkpoint_dir / record_->latest_checkpoint;
  read_checkpoint_metadata(path, {spec_.experiment_id, spec_.trial_id});
  const nlohmann::json state = read_checkpoint_state(path);
  load_checkpoint_model(model_, path);
  const auto file = (path / checkpoint_state_file).string();
  try {
    const loadstar::detail::StateReader read("checkpoint '" + file + "'", state);
    if (const auto name = read.get<std::string>("model"); name != model_.name()) {
      throw CheckpointError("checkpoint '" + file + "': expected a checkpoint of model '" +
                            model_.name() + "' but found one of model '" + name + "'");
    }
    auto& optimizer = model_.optimizer();
    optimizer.set_iterations(read.get<std::int64_t>("iterations"));
    if (const auto lr = read.get<nlohmann::json>("learning_rate"); lr.is_number()) {
      optimizer.set_learning_rate(lr.get<double>());
    }
    keras::detail::restore_global_seed(read.get<std::uint64_t>("seed"));
    model_.training_metrics().restore(read.get<nlohmann::json>("training_metrics"));
    // The states stateful layers carry to the next batch (checkpoints before them have none).
    const auto carried = state.find("carried_states");
    model_.restore_carried_states(carried != state.end() ? *carried : nlohmann::json::object());

    keras::detail::load_callback_states(read.get<nlohmann::json>("callbacks"), callbacks_,
                                        "checkpoint '" + file + "'", "the trial");

    sequencer_.restore(read.get<nlohmann::json>("sequencer"));
    context_.set_stop_requested(sequencer_.stop_requested());
    const auto best = read.get<nlohmann::json>("best_validation");
    best_ = best.is_number() ? std::optional<double>(best.get<double>()) : std::nullopt;
    epoch_ = read.get<std::uint64_t>("epoch");
    epoch_batches_ = read.get<std::uint64_t>("epoch_batches");
    want_epoch_begin_ = read.get<bool>("want_epoch_begin");
    // Checkpoints written before the epoch ends carried validation logs have none.
    validation_logs_ = keras::Logs();
    if (const auto saved = state.find("validation_logs"); saved != state.end()) {
      validation_logs_ = logs_from_json(*saved, "checkpoint '" + file + "': validation_logs");
    }
    data_epoch_ = read.get<std::size_t>("data_epoch");
    // A checkpoint taken between two batches of a workload (a pause); older ones have none.
    partial_workload_.reset();
    if (const auto partial = state.find("partial_workload");
        partial != state.end() && !partial->is_null()) {
      const std::string where = "checkpoint '" + file + "': partial_workload";
      const loadstar::detail::StateReader part(where, *partial);
      partial_workload_ = {part.get<std::uint64_t>("step_id"), part.get<std::uint64_t>("batches")};
    }
    // Each rank's own position when the checkpoint has one per rank of this trial's ranks;
    // otherwise (one process, or another number of ranks) rank 0's, which array loaders
    // translate to any number of ranks that keeps the global batch.
    const auto ranks = state.find("data_ranks");
    if (ranks != state.end() && ranks->is_array() &&
        ranks->size() == static_cast<std::size_t>(collective_.size())) {
      data_.restore(ranks->at(static_cast<std::size_t>(collective_.rank())));
    } else {
      data_.restore(read.get<nlohmann::json>("data"));
    }
    data_started_ = false;  // start_epoch continues the restored epoch
    if (chief_) metrics_.keep(read.get<std::uint64_t>("metrics_lines"));
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError("checkpoint '" + file + "': " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint '" + file + "': a value of the state cannot be read (" +
                          e.what() + ")");
  }
  // Checkpoints written after the one resumed from (by a run killed before it recorded them)
  // are not in the record; drop the record's entries beyond it too.
  auto& list = record_->checkpoints;
  while (!list.empty() && list.back().uuid != record_->latest_checkpoint)
    list.pop_back();
  if (verbose()) {
    end_bar_line();
    *out_ << owner() << ": resuming from checkpoint " << record_->latest_checkpoint << " at "
          << sequencer_.total_batches() << " batches\n";
  }
}

void TrialController::remove_orphans() const {
  std::error_code error;
  if (!std::filesystem::is_directory(spec_.checkpoint_dir, error)) return;
  std::vector<std::filesystem::path> orphans;
  std::vector<std::pair<std::filesystem::path, std::string>> checkpoints;  // and their uuids
  for (const auto& entry : std::filesystem::directory_iterator(spec_.checkpoint_dir, error)) {
    if (!entry.is_directory()) continue;
    std::string uuid = entry.path().filename().string();
    // A write killed before its metadata was there: its name says whose it is.
    const std::string staging_suffix =
        ".e" + std::to_string(spec_.experiment_id) + ".t" + std::to_string(spec_.trial_id) + ".new";
    if (uuid.starts_with('.') && uuid.ends_with(staging_suffix)) {
      orphans.push_back(entry.path());
      continue;
    }
    const bool temporary = uuid.size() > 4 && uuid.ends_with(".tmp");
    if (temporary) uuid.resize(uuid.size() - 4);
    const bool listed = uuid == record_->latest_checkpoint ||
                        std::any_of(record_->checkpoints.begin(), record_->checkpoints.end(),
                                    [&](const CheckpointEntry& c) { return c.uuid == uuid; });
    if (listed && !temporary) continue;
    try {
      const auto metadata =
          nlohmann::json::parse(keras::detail::read_bytes(entry.path() / checkpoint_metadata_file));
      if (metadata.value("experiment_id", std::uint64_t{0}) == spec_.experiment_id &&
          metadata.value("trial_id", std::uint64_t{0}) == spec_.trial_id) {
        checkpoints.emplace_back(entry.path(), uuid);
      }
    } catch (const std::exception&) {
      // Not (yet) a checkpoint with metadata: possibly another trial's, being written.
    }
  }
  for (const auto& path : orphans)
    std::filesystem::remove_all(path, error);
  for (const auto& [path, uuid] : checkpoints)
    discard_checkpoint(path, uuid);
}

void TrialController::discard_checkpoint(const std::filesystem::path& path,
                                         const std::string& uuid) const {
  const auto staging =
      spec_.checkpoint_dir / checkpoint_staging_name(uuid, spec_.experiment_id, spec_.trial_id);
  std::error_code ignored, renamed;
  std::filesystem::remove_all(staging, ignored);
  std::filesystem::rename(path, staging, renamed);
  std::filesystem::remove_all(renamed ? path : staging, ignored);
}

const keras::BatchView& TrialController::next_batch() {
  if (!data_started_) {
    data_.start_epoch(data_epoch_);
    data_started_ = true;
  }
  if (const auto* batch = data_.next()) return *batch;
  data_.finish_epoch();
  ++data_epoch_;
  data_.start_epoch(data_epoch_);
  if (const auto* batch = data_.next()) return *batch;
  throw ConfigError(owner() + ": training data loader: expected batches but epoch " +
                    std::to_string(data_epoch_) + " has none");
}

void TrialController::check_stop_training() {
  if (model_.stop_training) {
    context_.set_stop_requested(true);
    model_.stop_training = false;
  }
}

std::optional<std::uint64_t> TrialController::train(const Workload& w) {
  // A non-finite loss fails the trial unless a callback (TerminateOnNaN) or the scheduler has
  // asked it to stop, as fit does.
  const auto stopping = [&] { return model_.stop_training || context_.get_stop_requested(); };
  // Where a mid-workload checkpoint of this workload left it (its running metrics restored).
  std::uint64_t first = 0;
  if (partial_workload_ && partial_workload_->first == w.step_id) {
    first = partial_workload_->second;
  } else {
    model_.training_metrics().reset();
  }
  partial_workload_.reset();
  const keras::Logs none;
  const ClassWeight* class_weight = fit_.class_weight ? &*fit_.class_weight : nullptr;
  std::uint64_t total = w.total_batches_processed + first;
  keras::Logs logs;
  for (std::uint64_t i = first; i < w.num_batches; ++i) {
    if (reached_) *reached_ = total;
    if (i == 0) {
      list_.on_train_workload_begin(total, w.num_batches, none);
    }
    if (batches_per_epoch_ != 0 && want_epoch_begin_) {
      list_.on_epoch_begin(epoch_, none);
      if (bar_) bar_->on_epoch_begin(epoch_, none);
      want_epoch_begin_ = false;
    }
    if (bar_ && batches_per_epoch_ == 0 && i == first) {
      bar_->set_params({.verbose = 1,
                        .epochs = 1,
                        .steps = static_cast<std::size_t>(w.num_batches),
                        .output = out_});
      bar_->on_epoch_begin(0, none);
    }
    list_.on_train_batch_begin(epoch_batches_, none);
    const keras::BatchView& batch = next_batch();
    // Logs a device backend is still computing are read only where a callback reads them.
    logs.follow(model_.train_step(batch, {.class_weight = class_weight}));
    list_.on_train_batch_end(epoch_batches_, logs);
    if (bar_) bar_->on_train_batch_end(batches_per_epoch_ != 0 ? epoch_batches_ : i, logs);
    // After the hooks, as in fit.
    if (const auto loss = logs.ready() ? logs.get("loss") : std::nullopt;
        loss && !std::isfinite(*loss) && !stopping()) {
      throw keras::detail::non_finite_loss(model_.name(), *loss, epoch_, epoch_batches_, owner());
    }
    ++total;
    ++epoch_batches_;
    if (batches_per_epoch_ != 0 && epoch_batches_ == batches_per_epoch_) {
      if (bar_) bar_->on_epoch_end(epoch_, logs);
      pending_epoch_end_ = epoch_;
      pending_epoch_logs_ = logs;
      ++epoch_;
      epoch_batches_ = 0;
      want_epoch_begin_ = true;
      // Mid-workload no validation can come first.
      if (i + 1 < w.num_batches) end_epoch();
    }
    if (i + 1 < w.num_batches && !distributed() && interruption() != interruption_none) {
      if (reached_) *reached_ = total;
      return i + 1;
    }
  }
  if (reached_) *reached_ = total;
  if (const auto loss = logs.get("loss");
      total > 0 && loss && !std::isfinite(*loss) && !stopping()) {
    // A loss read late (a device backend's): the running mean shows it by the workload's end.
    // The last batch trained: the previous epoch's last when this one has none yet.
    const bool epoch_ended = epoch_batches_ == 0;
    throw keras::detail::non_finite_loss(model_.name(), *loss, epoch_ended ? epoch_ - 1 : epoch_,
                                         epoch_ended ? batches_per_epoch_ - 1 : epoch_batches_ - 1,
                                         owner());
  }
  if (distributed() && config_.average_training_metrics) {
    // The exact metrics of every rank's rows together (Determined averages per-rank means).
    logs = dist::merged_logs(model_, model_.training_metrics(), collective_);
  }
  list_.on_train_workload_end(total, logs);
  check_stop_training();
  if (chief_) {
    metrics_.append(metrics_line("training", w.step_id, total, logs));
    tensorboard_.training(total, logs);
  }
  // Without epochs the bar shows each training workload; with them, each epoch (the bar's
  // final line of an epoch stands for its workloads).
  if (bar_ && batches_per_epoch_ == 0) bar_->on_epoch_end(0, logs);
  return std::nullopt;
}

void TrialController::end_epoch() {
  if (!pending_epoch_end_) return;
  const std::uint64_t epoch = *pending_epoch_end_;
  pending_epoch_end_.reset();
  keras::Logs logs = std::move(pending_epoch_logs_);
  pending_epoch_logs_ = keras::Logs();
  for (const auto& [name, value] : validation_logs_)
    logs.set(name, value);
  list_.on_epoch_end(epoch, logs);
  check_stop_training();
}

double TrialController::validate(const Workload& w) {
  list_.on_test_begin();
  const std::optional<std::size_t> steps =
      options_.test ? std::optional<std::size_t>(1) : fit_.validation_steps;
  keras::Logs raw =
      validation_.validate(model_, data_options_, steps, owner() + ": validation data loader");
  if (distributed()) {
    // Every rank read its share: the global metrics from the merged sums and counts, the same
    // on every rank (so that every rank's sequencer decides alike).
    raw = dist::merged_logs(model_, model_.evaluation_metrics(), collective_);
  }
  keras::Logs logs;
  for (const auto& [name, value] : raw)
    logs.set("val_" + name, value);
  validation_logs_ = logs;
  list_.on_test_end(logs);
  check_stop_training();
  const double metric = searcher_metric(logs);
  last_validation_ = {w.total_batches_processed, metric};
  if (chief_) {
    metrics_.append(metrics_line("validation", w.step_id, w.total_batches_processed, logs));
    tensorboard_.validation(w.total_batches_processed, logs);
  }
  // A checkpoint taken at these batches (an operation's end checkpoints, then validates).
  if (!record_->checkpoints.empty() &&
      record_->checkpoints.back().batches == w.total_batches_processed &&
      !record_->checkpoints.back().validation) {
    record_->checkpoints.back().validation = metric;
    if (chief_) write_trial_record(spec_.trial_dir, *record_);
  }
  if (verbose()) {
    end_bar_line();
    *out_ << owner() << ": step " << w.step_id << ": validation at " << w.total_batches_processed
          << " batches:" << describe(logs) << "\n";
  }
  return metric;
}

double TrialController::searcher_metric(const keras::Logs& logs) const {
  std::string name = config_.searcher.metric.empty() ? "val_loss" : config_.searcher.metric;
  auto value = logs.get(name);
  if (!value && name.rfind("val_", 0) != 0) value = logs.get("val_" + name);
  if (!value) {
    std::string known;
    for (const auto& [key, v] : logs)
      known += (known.empty() ? "" : ", ") + key;
    throw ConfigError(owner() + ": searcher.metric '" + name +
                      "' is not among the validation metrics (" + known + ")");
  }
  if (std::isnan(*value)) {
    throw Error(owner() + ": the searcher metric '" + name + "' is NaN at " +
                std::to_string(sequencer_.total_batches()) + " batches");
  }
  return *value;
}

nlohmann::json TrialController::units(std::uint64_t batches) const {
  const std::uint64_t records = batches * context_.get_global_batch_size();
  const double epochs =
      config_.records_per_epoch == 0
          ? 0.0
          : static_cast<double>(records) / static_cast<double>(config_.records_per_epoch);
  return {{"batches", batches}, {"records", records}, {"epochs", epochs}};
}

void TrialController::checkpoint(const Workload& w, bool pause,
                                 std::optional<std::uint64_t> partial) {
  const std::uint64_t batches = w.total_batches_processed + partial.value_or(0);
  std::string uuid = new_checkpoint_uuid();
  if (distributed()) collective_.broadcast_bytes(uuid);  // rank 0's name, on every rank
  const auto u = units(batches);
  nlohmann::json metadata = {{"format", checkpoint_format},
                             {"framework", "loadstar"},
                             {"loadstar_version", loadstar_version},
                             {"uuid", uuid},
                             {"batches", u["batches"]},
                             {"records", u["records"]},
                             {"epochs", u["epochs"]},
                             {"experiment_id", spec_.experiment_id},
                             {"trial_id", spec_.trial_id},
                             {"trial_seed", context_.get_trial_seed()},
                             {"hparams", context_.get_hparams()},
                             {"experiment_config", config_.raw}};

  auto& optimizer = model_.optimizer();
  const nlohmann::json config = optimizer.get_config();
  const auto lr = config.find("learning_rate");
  nlohmann::json callback_states = keras::detail::callback_states(callbacks_);
  const nlohmann::json data = data_.state();  // one call: a loader process answers it
  nlohmann::json state = {
      {"model", model_.name()},
      {"iterations", optimizer.iterations()},
      {"learning_rate", lr != config.end() && lr->is_number() ? *lr : nlohmann::json()},
      {"seed", keras::detail::global_seed()},
      {"training_metrics", model_.training_metrics().state()},
      {"carried_states", model_.carried_states()},
      {"callbacks", std::move(callback_states)},
      {"sequencer", pause ? sequencer_.state() : sequencer_.state_after(w)},
      {"partial_workload",
       partial ? nlohmann::json{{"step_id", w.step_id}, {"batches", *partial}} : nlohmann::json()},
      {"best_validation", best_ ? nlohmann::json(*best_) : nlohmann::json()},
      {"epoch", epoch_},
      {"epoch_batches", epoch_batches_},
      {"want_epoch_begin", want_epoch_begin_},
      {"validation_logs", logs_json(validation_logs_)},
      {"data_epoch", data_epoch_},
      {"data", data},
      {"metrics_lines", metrics_.lines()}};
  if (distributed()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& text : collective_.allgather_strings(data.dump()))
      ranks.push_back(nlohmann::json::parse(text));
    state["data_ranks"] = std::move(ranks);
  }
  // Rank 0 writes; the others name the same folder.
  const auto path = chief_ ? write_checkpoint(spec_.checkpoint_dir, uuid, model_, metadata, state)
                           : spec_.checkpoint_dir / uuid;
  list_.on_checkpoint_end(path.string());
  if (!pause) sequencer_.complete(w);

  CheckpointEntry entry{uuid, batches, u["records"].get<std::uint64_t>(), u["epochs"].get<double>(),
                        std::nullopt};
  if (last_validation_ && last_validation_->first == batches)
    entry.validation = last_validation_->second;
  record_->checkpoints.push_back(entry);
  record_->latest_checkpoint = uuid;
  record_->total_batches = batches;
  apply_retention(false);
  if (chief_) write_trial_record(spec_.trial_dir, *record_);
  remove_unlisted();
  if (verbose()) {
    end_bar_line();
    *out_ << owner() << ": checkpoint " << uuid << " at " << batches << " batches\n";
  }
}

void TrialController::apply_retention(bool done) {
  auto& list = record_->checkpoints;
  const auto& storage = config_.checkpoint_storage;
  std::vector<bool> keep(list.size(), false);
  for (std::size_t i = 0; i < list.size() && i < storage.save_trial_latest; ++i)
    keep[list.size() - 1 - i] = true;
  std::vector<std::size_t> validated;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i].validation) validated.push_back(i);
  }
  const bool smaller = config_.searcher.smaller_is_better;
  std::stable_sort(validated.begin(), validated.end(), [&](std::size_t a, std::size_t b) {
    return smaller ? *list[a].validation < *list[b].validation
                   : *list[a].validation > *list[b].validation;
  });
  for (std::size_t i = 0; i < validated.size() && i < storage.save_trial_best; ++i)
    keep[validated[i]] = true;
  if (!validated.empty()) {
    record_->best_checkpoint = list[validated.front()].uuid;
    record_->best_validation = list[validated.front()].validation;
  }
  if (!done && !list.empty()) keep.back() = true;
  std::vector<CheckpointEntry> kept;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (keep[i])
      kept.push_back(list[i]);
    else
      removed_.push_back(list[i].uuid);
  }
  list = std::move(kept);
  if (list.empty() || list.back().uuid != record_->latest_checkpoint) {
    // The latest was removed by the rules (a finished trial with save_trial_latest 0).
    if (done && std::none_of(list.begin(), list.end(), [&](const CheckpointEntry& c) {
          return c.uuid == record_->latest_checkpoint;
        })) {
      record_->latest_checkpoint = list.empty() ? std::string() : list.back().uuid;
    }
  }
  if (std::none_of(list.begin(), list.end(),
                   [&](const CheckpointEntry& c) { return c.uuid == record_->best_checkpoint; })) {
    record_->best_checkpoint.clear();
  }
  if (done) remove_unlisted();
}

void TrialController::remove_unlisted() {
  if (!chief_) removed_.clear();
  for (const auto& uuid : removed_)
    discard_checkpoint(spec_.checkpoint_dir / uuid, uuid);
  removed_.clear();
}

nlohmann::json TrialController::metrics_line(const char* kind, std::uint64_t step_id,
                                             std::uint64_t batches, const keras::Logs& logs) const {
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, value] : logs)
    metrics[name] = value;
  const auto u = units(batches);
  return {{"kind", kind},
          {"trial_id", spec_.trial_id},
          {"step_id", step_id},
          {"batches", batches},
          {"records", u["records"]},
          {"epochs", u["epochs"]},
          {"metrics", std::move(metrics)}};
}

std::string TrialController::describe(const keras::Logs& logs) {
  std::ostringstream text;
  for (const auto& [name, value] : logs)
    text << " " << name << " " << value;
  return text.str();
}

void TrialController::start_bar() {
  if (!verbose()) return;
  bar_ = std::make_unique<keras::callbacks::ProgbarLogger>(1, *out_);
  std::size_t epochs = 1;
  std::optional<std::size_t> steps;
  if (batches_per_epoch_ != 0) {
    const std::uint64_t batches = sequencer_.operation_batches();
    epochs = static_cast<std::size_t>((batches + batches_per_epoch_ - 1) / batches_per_epoch_);
    steps = static_cast<std::size_t>(batches_per_epoch_);
  }
  bar_->set_model(model_);
  bar_->set_params({.verbose = 1, .epochs = epochs, .steps = steps, .output = out_});
  bar_->on_train_begin({});
}

}  // namespace loadstar::trial::detail
#endif
