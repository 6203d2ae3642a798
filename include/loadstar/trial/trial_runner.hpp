/// \file
/// `run_trial`: runs one trial of an experiment on this machine, from its registered class, with
/// Determined's workloads, checkpoints, metrics, exact resume and restarts.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "loadstar/keras/input.hpp"
#include "loadstar/trial/detail/trial_controller.hpp"
#include "loadstar/trial/detail/trial_files.hpp"
#include "loadstar/trial/invalid_hp.hpp"
#include "loadstar/trial/registry.hpp"
#include "loadstar/trial/trial_spec.hpp"

namespace loadstar::trial {

namespace detail {

/// The record a run starts from: `trial.json` if the trial ran before (checked to be this
/// trial's), a fresh one otherwise.
LOADSTAR_DECL TrialJson start_record(const TrialSpec& spec);

/// One attempt: builds the trial in Determined's order (training loader, validation loader,
/// model, callbacks) and runs it, resuming from the record's latest checkpoint. `reached`, when
/// given, follows the batches trained (the batch a failure happened at, once it throws).
LOADSTAR_DECL TrialResult run_attempt(const TrialSpec& spec, const RunOptions& options,
                                      TrialJson& record, std::uint64_t* reached = nullptr);

}  // namespace detail

/// Runs the trial `spec` until `options.until` (default: `searcher.max_length`): makes the trial
/// registered under `config.entrypoint`, resumes it from the latest checkpoint that
/// `trial_dir/trial.json` names (exactly: the weights, optimizer, data position, random state,
/// training metrics, callback states and workload sequencer; metrics after the checkpoint are
/// dropped and produced again), runs Determined's workload sequence
/// (master/internal/trial_workload_sequencer.go), appends every training workload and validation to
/// `metrics.jsonl`, checkpoints to `checkpoint_dir/<uuid>/` and keeps `trial.json` up to date. When
/// the trial throws, it is restarted in-process from its latest checkpoint up to `max_restarts`
/// times (counted in `trial.json` across processes), then the error is rethrown with the trial in
/// state `ERROR`. A failure that recurs after a restart at the same batch with the same message
/// is deterministic (a restart replays the same batches bitwise): it is not retried again, and
/// the trial errors with a message saying so. `InvalidHP` is not retried either: it is rethrown
/// at once with the trial in state `INVALID`, no restart used.
///
/// With `spec.collective` of several ranks (every rank calls `run_trial` with the same spec), the
/// trial is data-parallel: each rank trains on its shard at `global_batch_size / ranks`, the
/// gradients are combined by a `dist::DistributedOptimizer`, validation merges every rank's
/// metrics, and rank 0 alone writes files and prints. A rank that throws ends the job on every
/// rank (`Collective::abort`, naming the rank and the error) after rank 0 has recorded the
/// error; the experiment restarts the whole job from the latest checkpoint.
/// \code
/// auto result = trial::run_trial({.config = config, .hparams = {{"global_batch_size", 32}},
///                                 .trial_dir = "trial", .checkpoint_dir = "checkpoints"});
/// \endcode
LOADSTAR_DECL TrialResult run_trial(const TrialSpec& given, const RunOptions& options = {});

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

TrialJson start_record(const TrialSpec& spec) {
  if (auto record = read_trial_record(spec.trial_dir)) {
    if (record->trial_id != spec.trial_id || record->experiment_id != spec.experiment_id) {
      throw CheckpointError("trial record '" + (spec.trial_dir / "trial.json").string() +
                            "': expected experiment " + std::to_string(spec.experiment_id) +
                            " trial " + std::to_string(spec.trial_id) + " but found experiment " +
                            std::to_string(record->experiment_id) + " trial " +
                            std::to_string(record->trial_id));
    }
    record->state = "ACTIVE";
    record->error.clear();
    return *record;
  }
  TrialJson record;
  record.trial_id = spec.trial_id;
  record.experiment_id = spec.experiment_id;
  record.hparams = spec.hparams;
  record.trial_seed = spec.trial_seed;
  return record;
}

TrialResult run_attempt(const TrialSpec& spec, const RunOptions& options, TrialJson& record,
                        std::uint64_t* reached) {
  // Determined's environment.environment_variables, for the trial's code to read.
  for (const std::string& variable : spec.config.environment_variables) {
    const auto equals = variable.find('=');
    ::setenv(variable.substr(0, equals).c_str(), variable.substr(equals + 1).c_str(), 1);
  }
  TrialContext context(spec.config, spec.hparams, spec.trial_id, spec.trial_seed,
                       spec.experiment_id, spec.collective);
  // Determined seeds every generator with the trial seed before the trial is built
  // (`_set_random_seeds`), so the initial weights, shuffling and dropout follow from it.
  keras::set_random_seed(spec.trial_seed);
  auto trial = make_trial(spec.config.entrypoint, context);
  DataLoader training = trial->build_training_data_loader();
  if (spec.training_process) training = training.served_by(spec.training_process);
  const DataLoader validation = trial->build_validation_data_loader();
  const std::size_t datasets = static_cast<std::size_t>(training.kind() == "Dataset") +
                               static_cast<std::size_t>(validation.kind() == "Dataset");
  const std::size_t sharded = context.wrapped_datasets() + context.experimental.cached_datasets();
  if (context.distributed.size > 1 && sharded < datasets) {
    // Determined: "please use context.wrap_dataset(dataset)"; an unsharded dataset would be
    // read whole by every rank.
    throw ConfigError("trial " + std::to_string(spec.trial_id) + " ('" + spec.config.entrypoint +
                      "'): each Dataset loader in a trial of " +
                      std::to_string(context.distributed.size) +
                      " ranks must be sharded, with context.wrap_dataset(dataset) before "
                      "batching or by context.experimental's cache, but of its " +
                      std::to_string(datasets) + " Dataset loaders " + std::to_string(sharded) +
                      (sharded == 1 ? " is" : " are"));
  }
  if (context.fit_settings().shuffle_given) {
    // Determined ignores it for tf.data with a warning; here it is refused, not dropped.
    for (const DataLoader* loader : {static_cast<const DataLoader*>(&training), &validation}) {
      if (loader->kind() == "Dataset" || loader->kind() == "SequenceAdapter") {
        throw ConfigError(
            "trial " + std::to_string(spec.trial_id) + " ('" + spec.config.entrypoint +
            "'): configure_fit: shuffle applies to arrays and Sequence loaders, but the " +
            (loader == &training ? "training" : "validation") + " loader is a " + loader->kind() +
            (loader->kind() == "Dataset" ? " (shuffle it in the Dataset itself)"
                                         : " (set shuffling in the SequenceAdapter's options)"));
      }
    }
  }
  std::shared_ptr<keras::Model> model;
  {
    std::optional<keras::mixed_precision::PolicyScope> policy;
    if (context.dtype_policy()) policy.emplace(*context.dtype_policy());
    model = trial->build_model();
  }
  if (!model) {
    throw ConfigError("trial " + std::to_string(spec.trial_id) + " ('" + spec.config.entrypoint +
                      "'): build_model returned no model");
  }
  context.wrap_model(*model);
  if (context.distributed.size > 1 || spec.config.aggregation_frequency > 1) {
    // Horovod's DistributedOptimizer around the trial's own, unless it wrapped it already (with
    // one rank: for its local aggregation).
    model->set_optimizer(context.wrap_optimizer(model->optimizer_ptr()));
  }
  auto callbacks = trial->keras_callbacks();
  TrialController controller(spec, options, context, *model, training, validation,
                             std::move(callbacks));
  return controller.run(record, reached);
}

}  // namespace loadstar::trial::detail
namespace loadstar::trial {

TrialResult run_trial(const TrialSpec& given, const RunOptions& options) {
  TrialSpec spec = given;
  if (options.test) spec.config = detail::test_overrides(std::move(spec.config));
  if (spec.trial_dir.empty() || spec.checkpoint_dir.empty()) {
    throw ConfigError("trial " + std::to_string(spec.trial_id) +
                      ": trial_dir and checkpoint_dir must be given");
  }
  detail::TrialJson record = detail::start_record(spec);
  if (spec.collective && spec.collective->size() > 1) {
    dist::Collective& ranks = *spec.collective;
    try {
      return detail::run_attempt(spec, options, record);
    } catch (const std::exception& e) {
      const std::string message =
          ranks.describe() + ": trial " + std::to_string(spec.trial_id) + ": " + e.what();
      record.state = dynamic_cast<const InvalidHP*>(&e) ? "INVALID" : "ERROR";
      record.error = message;
      try {
        detail::write_trial_record(spec.trial_dir, record);
      } catch (const std::exception&) {
        // The original error matters more.
      }
      ranks.abort(message);
    }
  }
  // The batch and message of the failure that caused the last restart.
  std::optional<std::pair<std::uint64_t, std::string>> last_failure;
  for (;;) {
    std::uint64_t reached = record.total_batches;
    try {
      return detail::run_attempt(spec, options, record, &reached);
    } catch (const InvalidHP& e) {
      // Determined's INVALID_HP: the hyperparameters, not the run, are at fault; no restart.
      record.state = "INVALID";
      record.error = e.what();
      try {
        detail::write_trial_record(spec.trial_dir, record);
      } catch (const std::exception&) {
        // The original error matters more.
      }
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      // A restart replays the batches since the checkpoint bitwise: the same failure at the
      // same batch would recur on every restart.
      const bool recurred =
          last_failure && last_failure->first == reached && last_failure->second == what;
      // A bad entrypoint or a trial that cannot be built fails the same way every time.
      const bool retry =
          !recurred && record.restarts < spec.config.max_restarts &&
          !(dynamic_cast<const ConfigError*>(&e) && !has_trial(spec.config.entrypoint));
      if (!retry) {
        record.state = "ERROR";
        record.error = what;
        if (recurred) {
          record.error = "trial " + std::to_string(spec.trial_id) + ": the failure at batch " +
                         std::to_string(reached) + " recurred at the same batch after restart " +
                         std::to_string(record.restarts) + " of " +
                         std::to_string(spec.config.max_restarts) +
                         ", so it is deterministic and is not retried again: " + what;
        }
        try {
          detail::write_trial_record(spec.trial_dir, record);
        } catch (const std::exception&) {
          // The original error matters more.
        }
        if (recurred) throw Error(record.error);
        throw;
      }
      last_failure = {reached, what};
      ++record.restarts;
      // The record on disk names the checkpoint to restart from; the in-memory one may list
      // checkpoints written after it.
      if (auto saved = detail::read_trial_record(spec.trial_dir)) {
        const auto restarts = record.restarts;
        record = *saved;
        record.restarts = restarts;
        record.state = "ACTIVE";
      } else {
        const auto restarts = record.restarts;
        record = detail::start_record(spec);
        record.restarts = restarts;
      }
      detail::write_trial_record(spec.trial_dir, record);
      if (options.verbose) {
        (options.output ? *options.output : std::cout)
            << "trial " << spec.trial_id << ": restart " << record.restarts << " of "
            << spec.config.max_restarts << " after: " << e.what() << "\n";
      }
    }
  }
}

}  // namespace loadstar::trial
#endif
