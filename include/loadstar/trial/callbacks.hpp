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
  explicit EarlyStopping(keras::callbacks::EarlyStoppingOptions options = {})
      : keras_(std::move(options), "determined.keras.callbacks.EarlyStopping", "validation") {}

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
  void on_train_end(const keras::Logs& logs) override { keras_.on_train_end(logs); }

  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  std::string class_name() const override { return "determined.keras.callbacks.EarlyStopping"; }
  nlohmann::json get_config() const override { return keras_.get_config(); }

  /// The validation (counted from 0) that stopped the trial; 0 when none did.
  std::size_t stopped_epoch() const noexcept { return keras_.stopped_epoch(); }
  /// The best value of the monitored metric so far, and its validation.
  double best() const noexcept { return keras_.best(); }
  std::size_t best_epoch() const noexcept { return keras_.best_epoch(); }
  /// The validations seen.
  std::uint64_t test_end_count() const noexcept { return test_end_count_; }

 private:
  keras::callbacks::EarlyStopping keras_;
  std::uint64_t test_end_count_ = 0;
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

nlohmann::json EarlyStopping::get_state() const {
  nlohmann::json state = keras_.get_state();
  state["test_end_count"] = test_end_count_;
  return state;
}

void EarlyStopping::load_state(const nlohmann::json& state) {
  const loadstar::detail::StateReader read("determined.keras.callbacks.EarlyStopping", state);
  test_end_count_ = read.get<std::uint64_t>("test_end_count");
  keras_.load_state(state);
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
