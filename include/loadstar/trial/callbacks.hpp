/// \file
/// Determined's own `determined.keras.callbacks.EarlyStopping` and `ReduceLROnPlateau`: Keras's
/// callbacks of those names, acting after each validation (`on_test_end`) instead of each epoch,
/// with their state in the trial's checkpoints.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/callbacks/early_stopping.hpp"
#include "loadstar/keras/callbacks/reduce_lr_on_plateau.hpp"
#include "loadstar/tensor.hpp"
#include "loadstar/trial/callback.hpp"

namespace loadstar::trial::callbacks {

/// Determined's `EarlyStopping` (harness/determined/keras/callbacks.py): Keras's `EarlyStopping`
/// (tf.keras 2.11's rule, as `keras::callbacks::EarlyStopping`) with the same options
/// (`keras::callbacks::EarlyStoppingOptions`: monitor, min_delta, patience, verbose, mode,
/// baseline, restore_best_weights), judged after every validation of the trial (so
/// `min_validation_period` sets its pace) rather than every epoch; `on_epoch_end` is ignored. Its
/// patience counts validations. When it stops, the trial gets a stop request: it checkpoints and
/// ends as completed, and the searcher is told it exited early.
///
/// Its state (`wait`, `best`, `best_epoch`, `stopped_epoch`, `test_end_count`, and with
/// `restore_best_weights` the best weights) is in every checkpoint, so a resumed trial stops
/// where the uninterrupted one does. (Determined's own keeps `best` out of its state, so a
/// resume there starts the best over; here the resume is exact.)
/// \code
/// std::vector<std::shared_ptr<keras::callbacks::Callback>> keras_callbacks() override {
///   return {std::make_shared<trial::callbacks::EarlyStopping>(
///       keras::callbacks::EarlyStoppingOptions{.monitor = "val_loss", .patience = 3})};
/// }
/// \endcode
class EarlyStopping : public Callback {
 public:
  /// `ConfigError` for a mode other than auto, min or max.
  LOADSTAR_DECL explicit EarlyStopping(keras::callbacks::EarlyStoppingOptions options = {});

  LOADSTAR_DECL void on_train_begin(const keras::Logs&) override;
  LOADSTAR_DECL void on_test_end(const keras::Logs& logs) override;
  LOADSTAR_DECL void on_train_end(const keras::Logs&) override;

  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  std::string class_name() const override { return "determined.keras.callbacks.EarlyStopping"; }
  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// The validation (counted from 0) that stopped the trial; 0 when none did.
  std::size_t stopped_epoch() const noexcept { return stopped_epoch_; }
  /// The best value of the monitored metric so far, and its validation.
  double best() const noexcept { return best_; }
  std::size_t best_epoch() const noexcept { return best_epoch_; }
  /// The validations seen.
  std::uint64_t test_end_count() const noexcept { return test_end_count_; }

 private:
  bool improves(double value, double reference) const {
    return maximize_ ? value - delta_ > reference : value - delta_ < reference;
  }

  keras::callbacks::EarlyStoppingOptions options_;
  bool maximize_ = false;
  double delta_ = 0.0;
  std::size_t wait_ = 0;
  std::size_t stopped_epoch_ = 0;
  double best_ = 0.0;
  std::size_t best_epoch_ = 0;
  std::uint64_t test_end_count_ = 0;
  std::vector<Tensor<float>> best_weights_;
  bool resumed_ = false;
};

/// Determined's `ReduceLROnPlateau` (harness/determined/keras/callbacks.py): Keras's
/// `ReduceLROnPlateau` with the same options (`keras::callbacks::ReduceLROnPlateauOptions`:
/// monitor, factor, patience, verbose, mode, min_delta, cooldown, min_lr), judged after every
/// validation of the trial rather than every epoch; `on_epoch_end` is ignored. Its patience and
/// cooldown count validations. Its state (`best`, `wait`, `cooldown_counter`, `test_end_count`)
/// is in every checkpoint, and the lowered learning rate is the optimizer's, also checkpointed.
/// \code
/// auto plateau = std::make_shared<trial::callbacks::ReduceLROnPlateau>(
///     keras::callbacks::ReduceLROnPlateauOptions{.factor = 0.5, .patience = 2});
/// \endcode
class ReduceLROnPlateau : public Callback {
 public:
  /// `ConfigError` for a factor of 1 or more and for an unknown mode.
  explicit ReduceLROnPlateau(keras::callbacks::ReduceLROnPlateauOptions options = {})
      : keras_(std::move(options)) {}

  void set_model(keras::Model& model) override {
    Callback::set_model(model);
    keras_.set_model(model);
  }
  void set_params(const keras::CallbackParams& params) override {
    Callback::set_params(params);
    keras_.set_params(params);
  }

  void on_train_begin(const keras::Logs& logs) override { keras_.on_train_begin(logs); }
  void on_test_end(const keras::Logs& logs) override {
    keras_.on_epoch_end(static_cast<std::size_t>(test_end_count_), logs);
    ++test_end_count_;
  }

  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  std::string class_name() const override { return "determined.keras.callbacks.ReduceLROnPlateau"; }
  nlohmann::json get_config() const override { return keras_.get_config(); }

  /// The validations seen.
  std::uint64_t test_end_count() const noexcept { return test_end_count_; }

 private:
  keras::callbacks::ReduceLROnPlateau keras_;
  std::uint64_t test_end_count_ = 0;
};

}  // namespace loadstar::trial::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::callbacks {

EarlyStopping::EarlyStopping(keras::callbacks::EarlyStoppingOptions options)
    : options_(std::move(options)) {
  const auto& m = options_.mode;
  if (m != "auto" && m != "min" && m != "max") {
    throw ConfigError(
        "determined.keras.callbacks.EarlyStopping: mode must be 'auto', 'min' or "
        "'max' but is '" +
        m + "'");
  }
  const auto ends = [&](const std::string& suffix) {
    return options_.monitor.size() >= suffix.size() &&
           options_.monitor.compare(options_.monitor.size() - suffix.size(), suffix.size(),
                                    suffix) == 0;
  };
  // Keras's "auto": larger is better for accuracies and AUCs.
  maximize_ = m == "max" || (m == "auto" && (ends("acc") || ends("accuracy") || ends("auc")));
  delta_ = maximize_ ? std::abs(options_.min_delta) : -std::abs(options_.min_delta);
}

void EarlyStopping::on_train_begin(const keras::Logs&) {
  // Determined loads a callback's state after on_train_begin; here load_state comes first and
  // on_train_begin keeps it.
  if (std::exchange(resumed_, false)) return;
  wait_ = 0;
  stopped_epoch_ = 0;
  best_ = maximize_ ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  best_epoch_ = 0;
  best_weights_.clear();
}

void EarlyStopping::on_test_end(const keras::Logs& logs) {
  const std::size_t epoch = static_cast<std::size_t>(test_end_count_++);
  const auto current = logs.get(options_.monitor);
  if (!current) {
    out() << "early stopping: the metric '" << options_.monitor
          << "' is not in the validation logs, which hold: " << keras::detail::joined_names(logs)
          << "\n";
    return;
  }
  if (options_.restore_best_weights && best_weights_.empty()) best_weights_ = model().get_weights();
  ++wait_;
  if (improves(*current, best_)) {
    best_ = *current;
    best_epoch_ = epoch;
    if (options_.restore_best_weights) best_weights_ = model().get_weights();
    // Only restart the wait when beating both the baseline and the best so far.
    if (!options_.baseline || improves(*current, *options_.baseline)) wait_ = 0;
  }
  if (wait_ >= options_.patience && epoch > 0) {
    stopped_epoch_ = epoch;
    model().stop_training = true;
    if (options_.restore_best_weights && !best_weights_.empty()) {
      if (options_.verbose > 0) {
        out() << "Restoring model weights from the end of the best validation: " << best_epoch_ + 1
              << ".\n";
      }
      model().set_weights(best_weights_);
    }
  }
}

void EarlyStopping::on_train_end(const keras::Logs&) {
  if (stopped_epoch_ > 0 && options_.verbose > 0) {
    out() << "Epoch " << keras::detail::epoch_label(stopped_epoch_) << ": early stopping\n";
  }
}

nlohmann::json EarlyStopping::get_state() const {
  nlohmann::json weights = nlohmann::json::array();
  for (const auto& w : best_weights_) {
    nlohmann::json shape = nlohmann::json::array();
    for (const auto d : w.shape())
      shape.push_back(d);
    weights.push_back(
        {{"shape", std::move(shape)}, {"values", std::vector<float>(w.begin(), w.end())}});
  }
  return {{"wait", wait_},
          {"stopped_epoch", stopped_epoch_},
          {"best", best_},
          {"best_epoch", best_epoch_},
          {"test_end_count", test_end_count_},
          {"best_weights", std::move(weights)}};
}

void EarlyStopping::load_state(const nlohmann::json& state) {
  const std::string owner = "determined.keras.callbacks.EarlyStopping";
  const loadstar::detail::StateReader read(owner, state);
  wait_ = read.get<std::size_t>("wait");
  stopped_epoch_ = read.get<std::size_t>("stopped_epoch");
  best_ = read.get<double>("best");
  best_epoch_ = read.get<std::size_t>("best_epoch");
  test_end_count_ = read.get<std::uint64_t>("test_end_count");
  best_weights_.clear();
  for (const auto& w : read.get<nlohmann::json>("best_weights")) {
    const loadstar::detail::StateReader entry(owner + " best_weights", w);
    const auto shape = entry.get<std::vector<std::size_t>>("shape");
    const auto values = entry.get<std::vector<float>>("values");
    Tensor<float> tensor{Shape(shape)};
    if (tensor.size() != values.size()) {
      throw CheckpointError(owner + " state: best_weights: expected " +
                            std::to_string(tensor.size()) + " values for its shape but found " +
                            std::to_string(values.size()));
    }
    std::copy(values.begin(), values.end(), tensor.begin());
    best_weights_.push_back(std::move(tensor));
  }
  resumed_ = true;
}

nlohmann::json EarlyStopping::get_config() const {
  return {{"monitor", options_.monitor},
          {"min_delta", options_.min_delta},
          {"patience", options_.patience},
          {"verbose", options_.verbose},
          {"mode", options_.mode},
          {"baseline", options_.baseline ? nlohmann::json(*options_.baseline) : nullptr},
          {"restore_best_weights", options_.restore_best_weights}};
}

nlohmann::json ReduceLROnPlateau::get_state() const {
  nlohmann::json state = keras_.get_state();
  state["test_end_count"] = test_end_count_;
  return state;
}

void ReduceLROnPlateau::load_state(const nlohmann::json& state) {
  const loadstar::detail::StateReader read("determined.keras.callbacks.ReduceLROnPlateau", state);
  test_end_count_ = read.get<std::uint64_t>("test_end_count");
  keras_.load_state(state);
}

}  // namespace loadstar::trial::callbacks
#endif
