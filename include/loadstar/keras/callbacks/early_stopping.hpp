/// \file
/// `EarlyStopping`: stops training when a monitored value stops improving.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/model.hpp"

namespace loadstar::keras::callbacks {

/// `EarlyStopping`'s Keras arguments, with Keras's defaults.
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  /// The smallest change that counts as an improvement.
  double min_delta = 0.0;
  /// Epochs without improvement before training stops.
  std::size_t patience = 0;
  int verbose = 0;
  /// `"auto"` (max for names ending in `acc`, `accuracy` or `auc`, else min), `"min"`, `"max"`.
  std::string mode = "auto";
  /// Training stops unless the monitored value beats this within `patience` epochs.
  std::optional<double> baseline = std::nullopt;
  /// Restore the weights of the best epoch when stopping.
  bool restore_best_weights = false;
};

/// Keras's `EarlyStopping` (tf.keras 2.11 callbacks.py): after each epoch, compares the
/// monitored log with the best so far; after `patience` epochs without an improvement of more
/// than `min_delta` it sets `model.stop_training` and, with `restore_best_weights`, restores the
/// weights of the best epoch. `stopped_epoch()` and `best()` tell what happened. Its state
/// (`get_state`) holds the best weights too, so that a resumed run restores the same ones.
/// \code
/// auto stop = std::make_shared<EarlyStopping>(
///     EarlyStoppingOptions{.monitor = "val_loss", .patience = 2, .restore_best_weights = true});
/// model.fit(x, y, {.epochs = 100, .validation_split = 0.2, .callbacks = {stop}});
/// \endcode
class EarlyStopping : public Callback {
 public:
  /// Throws `ConfigError` for a mode other than auto, min or max.
  LOADSTAR_DECL explicit EarlyStopping(EarlyStoppingOptions options = {});
  /// The same, named `owner` in its messages and errors, and counting `period`s (`"epoch"`):
  /// the form Determined's trial version wraps (`trial::callbacks::EarlyStopping`, which calls
  /// `on_epoch_end` after each validation).
  LOADSTAR_DECL EarlyStopping(EarlyStoppingOptions options, std::string owner, std::string period);

  LOADSTAR_DECL void on_train_begin(const Logs&) override;

  LOADSTAR_DECL void on_epoch_end(std::size_t epoch, const Logs& logs) override;

  void on_train_end(const Logs&) override {
    if (stopped_epoch_ > 0 && options_.verbose > 0) {
      out() << "Epoch " << detail::epoch_label(stopped_epoch_) << ": early stopping\n";
    }
  }

  /// `{"wait", "stopped_epoch", "best", "best_epoch", "best_weights"}`, the best weights as
  /// `{"shape", "values"}` objects (empty unless `restore_best_weights` kept some). A state
  /// without `best_weights` (written before they were kept) loads with none.
  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  std::string class_name() const override { return "EarlyStopping"; }
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  /// The epoch training stopped at (0 when it did not stop early).
  std::size_t stopped_epoch() const noexcept { return stopped_epoch_; }
  /// The best value of the monitored log, and its epoch.
  double best() const noexcept { return best_; }
  std::size_t best_epoch() const noexcept { return best_epoch_; }

 private:
  bool improves(double value, double reference) const {
    return maximize_ ? value - delta_ > reference : value - delta_ < reference;
  }

  EarlyStoppingOptions options_;
  std::string owner_ = "early stopping", period_ = "epoch";
  bool maximize_ = false;
  double delta_ = 0.0;
  std::size_t wait_ = 0;
  std::size_t stopped_epoch_ = 0;
  double best_ = 0.0;
  std::size_t best_epoch_ = 0;
  std::vector<Tensor<float>> best_weights_;
  bool resumed_ = false;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options)
    : EarlyStopping(std::move(options), "early stopping", "epoch") {}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options, std::string owner, std::string period)
    : options_(std::move(options)), owner_(std::move(owner)), period_(std::move(period)) {
  const auto& m = options_.mode;
  if (m != "auto" && m != "min" && m != "max") {
    throw ConfigError(owner_ + ": mode must be 'auto', 'min' or 'max' but is '" + m + "'");
  }
  const auto ends = [&](const std::string& suffix) {
    return options_.monitor.size() >= suffix.size() &&
           options_.monitor.compare(options_.monitor.size() - suffix.size(), suffix.size(),
                                    suffix) == 0;
  };
  maximize_ = m == "max" || (m == "auto" && (ends("acc") || ends("accuracy") || ends("auc")));
  delta_ = maximize_ ? std::abs(options_.min_delta) : -std::abs(options_.min_delta);
}

void EarlyStopping::on_train_begin(const Logs&) {
  if (std::exchange(resumed_, false)) return;
  wait_ = 0;
  stopped_epoch_ = 0;
  best_ = maximize_ ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  best_weights_.clear();
  best_epoch_ = 0;
}

void EarlyStopping::on_epoch_end(std::size_t epoch, const Logs& logs) {
  const auto current = logs.get(options_.monitor);
  if (!current) {
    out() << owner_ << ": the metric '" << options_.monitor
          << "' is not in the logs, which hold: " << detail::joined_names(logs) << "\n";
    return;
  }
  if (options_.restore_best_weights && best_weights_.empty()) {
    best_weights_ = model().get_weights();
  }
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
        out() << "Restoring model weights from the end of the best " << period_ << ": "
              << best_epoch_ + 1 << ".\n";
      }
      model().set_weights(best_weights_);
    }
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
          {"best_weights", std::move(weights)}};
}

void EarlyStopping::load_state(const nlohmann::json& state) {
  const detail::StateReader read(owner_, state);
  wait_ = read.get<std::size_t>("wait");
  stopped_epoch_ = read.get<std::size_t>("stopped_epoch");
  best_ = read.get<double>("best");
  best_epoch_ = read.get<std::size_t>("best_epoch");
  best_weights_.clear();
  if (state.contains("best_weights")) {
    const auto weights = read.get<nlohmann::json>("best_weights");
    if (!weights.is_array()) {
      throw CheckpointError(owner_ + " state: best_weights: expected an array but found " +
                            weights.dump());
    }
    for (const auto& w : weights) {
      const detail::StateReader entry(owner_ + " best_weights", w);
      const auto shape = entry.get<std::vector<std::size_t>>("shape");
      const auto values = entry.get<std::vector<float>>("values");
      Tensor<float> tensor{Shape(shape)};
      if (tensor.size() != values.size()) {
        throw CheckpointError(owner_ + " state: best_weights: expected " +
                              std::to_string(tensor.size()) + " values for its shape but found " +
                              std::to_string(values.size()));
      }
      std::copy(values.begin(), values.end(), tensor.begin());
      best_weights_.push_back(std::move(tensor));
    }
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

std::shared_ptr<Callback> EarlyStopping::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "EarlyStopping");
  read.expect("start_from_epoch", 0, "loadstar counts from the first epoch");
  return std::make_shared<EarlyStopping>(
      EarlyStoppingOptions{.monitor = read.get("monitor", "val_loss"),
                           .min_delta = read.get("min_delta", 0.0),
                           .patience = read.get("patience", std::size_t{0}),
                           .verbose = read.get("verbose", 0),
                           .mode = detail::config_mode(read),
                           .baseline = read.optional<double>("baseline"),
                           .restore_best_weights = read.get("restore_best_weights", false)});
}

}  // namespace loadstar::keras::callbacks
#endif
