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

namespace detail {

/// A Keras callback `K` judged after each validation of the trial instead of each epoch:
/// `on_test_end` is `K`'s `on_epoch_end`, counted in validations (`test_end_count`, in the
/// state beside `K`'s own).
template <class K>
class PerValidation : public Callback {
 public:
  template <class... A>
  explicit PerValidation(A&&... args) : keras_(std::forward<A>(args)...) {}

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

  nlohmann::json get_state() const override {
    nlohmann::json state = keras_.get_state();
    state["test_end_count"] = test_end_count_;
    return state;
  }
  void load_state(const nlohmann::json& state) override {
    const loadstar::detail::StateReader read(class_name(), state);
    test_end_count_ = read.get<std::uint64_t>("test_end_count");
    keras_.load_state(state);
  }

  nlohmann::json get_config() const override { return keras_.get_config(); }

  /// The validations seen.
  std::uint64_t test_end_count() const noexcept { return test_end_count_; }

 protected:
  K keras_;

 private:
  std::uint64_t test_end_count_ = 0;
};

}  // namespace detail

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
class EarlyStopping : public detail::PerValidation<keras::callbacks::EarlyStopping> {
 public:
  /// `ConfigError` for a mode other than auto, min or max.
  explicit EarlyStopping(keras::callbacks::EarlyStoppingOptions options = {})
      : PerValidation(std::move(options), "determined.keras.callbacks.EarlyStopping",
                      "validation") {}

  std::string class_name() const override { return "determined.keras.callbacks.EarlyStopping"; }

  /// The validation (counted from 0) that stopped the trial; 0 when none did.
  std::size_t stopped_epoch() const noexcept { return keras_.stopped_epoch(); }
  /// The best value of the monitored metric so far, and its validation.
  double best() const noexcept { return keras_.best(); }
  std::size_t best_epoch() const noexcept { return keras_.best_epoch(); }
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
class ReduceLROnPlateau : public detail::PerValidation<keras::callbacks::ReduceLROnPlateau> {
 public:
  /// `ConfigError` for a factor of 1 or more and for an unknown mode.
  explicit ReduceLROnPlateau(keras::callbacks::ReduceLROnPlateauOptions options = {})
      : PerValidation(std::move(options)) {}

  std::string class_name() const override { return "determined.keras.callbacks.ReduceLROnPlateau"; }
};

}  // namespace loadstar::trial::callbacks
