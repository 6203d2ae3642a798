/// \file
/// Determined's Native API (`det.experimental.keras.init`): a plain `main()` builds its model and
/// calls `fit`, with the same workloads, checkpoints, metrics and exact resume as a trial class.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/keras/input.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/random.hpp"
#include "loadstar/trial/data_loader.hpp"
#include "loadstar/trial/hyperparameters.hpp"
#include "loadstar/trial/trial_context.hpp"
#include "loadstar/trial/trial_runner.hpp"

namespace loadstar::trial {

/// Where and how `init` runs the training.
struct NativeOptions {
  /// The hyperparameters; empty: one draw from the config's `hyperparameters` (their values for
  /// `const` ones), seeded with `trial_seed`.
  nlohmann::json hparams = nlohmann::json::object();
  std::uint32_t trial_seed = 0;
  std::uint64_t experiment_id = 1;
  std::uint64_t trial_id = 1;
  /// `metrics.jsonl` and `trial.json` (default `./native/trial`).
  std::filesystem::path trial_dir = "native/trial";
  /// Checkpoints (default `./native/checkpoints`).
  std::filesystem::path checkpoint_dir = "native/checkpoints";
  /// Unset: `searcher.max_length`.
  std::optional<Length> until = {};
  /// Determined's test mode: one batch, one validation batch, a checkpoint.
  bool test = false;
  bool verbose = true;
};

/// What `init` returns: the trial context (hyperparameters, `configure_fit`) and `fit`.
class NativeContext {
 public:
  LOADSTAR_DECL NativeContext(ExperimentConfig config, NativeOptions options);

  TrialContext& context() noexcept { return *context_; }
  const nlohmann::json& get_hparams() const noexcept { return context_->get_hparams(); }
  const nlohmann::json& get_hparam(std::string_view name) const {
    return context_->get_hparam(name);
  }

  /// Trains the compiled `model` on `training`, validating on `validation`, as a trial: resumes
  /// from the latest checkpoint in `checkpoint_dir` that `trial_dir/trial.json` names, and after
  /// an exception restarts from the latest checkpoint up to `max_restarts` times (a failure before
  /// the first checkpoint is rethrown: the model's initial weights are gone).
  LOADSTAR_DECL TrialResult
  fit(keras::Model& model, const DataLoader& training, const DataLoader& validation,
      std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks = {});

 private:
  NativeOptions options_;
  TrialSpec spec_;
  std::unique_ptr<TrialContext> context_;
};

/// Determined's `init(config)` for a plain `main()` (one trial: `ConfigError` for a searcher other
/// than `single`):
/// \code
/// auto native = trial::init(trial::load_experiment_config("const.yaml"));
/// auto model = build(native.get_hparam("hidden_size").get<int>());
/// native.fit(*model, {x_train, y_train}, {x_test, y_test});
/// \endcode
inline NativeContext init(ExperimentConfig config, NativeOptions options = {}) {
  return NativeContext(std::move(config), std::move(options));
}

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

NativeContext::NativeContext(ExperimentConfig config, NativeOptions options)
    : options_(std::move(options)) {
  if (options_.test) config = detail::test_overrides(std::move(config));
  if (config.searcher.name != "single") {
    // Determined submits an experiment whose trials each run the script; here the script is one
    // trial, so a search would draw one point and drop the rest.
    throw ConfigError("trial::init: searcher.name: expected single but found '" +
                      config.searcher.name +
                      "': the Native API trains one trial in this process; run a " +
                      config.searcher.name + " search with a trial class and `experiment create`");
  }
  if (options_.hparams.empty()) {
    SplitMix64 rng(options_.trial_seed);
    options_.hparams = sample_hparams(config.hyperparameters, rng);
  }
  spec_.config = config;
  spec_.experiment_id = options_.experiment_id;
  spec_.trial_id = options_.trial_id;
  spec_.hparams = options_.hparams;
  spec_.trial_seed = options_.trial_seed;
  spec_.trial_dir = options_.trial_dir;
  spec_.checkpoint_dir = options_.checkpoint_dir;
  context_ = std::make_unique<TrialContext>(std::move(config), options_.hparams, options_.trial_id,
                                            options_.trial_seed, options_.experiment_id);
  // As Determined's `pre_execute_hook`: the model built after `init` draws its initial weights
  // from the trial seed.
  keras::set_random_seed(options_.trial_seed);
}

TrialResult NativeContext::fit(keras::Model& model, const DataLoader& training,
                               const DataLoader& validation,
                               std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks) {
  context_->wrap_model(model);
  if (spec_.config.aggregation_frequency > 1) {
    model.set_optimizer(context_->wrap_optimizer(model.optimizer_ptr()));
  }
  RunOptions run{.until = options_.until, .test = options_.test, .verbose = options_.verbose};
  detail::TrialJson record = detail::start_record(spec_);
  for (;;) {
    try {
      context_->set_stop_requested(false);
      detail::TrialController controller(spec_, run, *context_, model, training, validation,
                                         callbacks);
      return controller.run(record);
    } catch (const std::exception& e) {
      auto saved = detail::read_trial_record(spec_.trial_dir);
      if (record.restarts >= spec_.config.max_restarts || !saved ||
          saved->latest_checkpoint.empty()) {
        record.state = "ERROR";
        record.error = e.what();
        try {
          detail::write_trial_record(spec_.trial_dir, record);
        } catch (const std::exception&) {
        }
        throw;
      }
      const auto restarts = record.restarts + 1;
      record = *saved;
      record.restarts = restarts;
      record.state = "ACTIVE";
      detail::write_trial_record(spec_.trial_dir, record);
    }
  }
}

}  // namespace loadstar::trial
#endif
