/// \file
/// `ReduceLROnPlateau`: lowers the learning rate when a monitored value stops improving.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/model.hpp"

namespace loadstar::keras::callbacks {

/// `ReduceLROnPlateau`'s Keras arguments, with Keras's defaults.
struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  /// The learning rate is multiplied by `factor` (< 1) on a plateau.
  double factor = 0.1;
  /// Epochs without improvement before the learning rate is lowered.
  std::size_t patience = 10;
  int verbose = 0;
  /// `"auto"` (max when the name contains `acc`, else min), `"min"`, `"max"`.
  std::string mode = "auto";
  /// The smallest change that counts as an improvement.
  double min_delta = 1e-4;
  /// Epochs to wait after a reduction before counting again.
  std::size_t cooldown = 0;
  /// The learning rate is never lowered below this.
  double min_lr = 0.0;
};

/// Keras's `ReduceLROnPlateau` (tf.keras 2.11 callbacks.py): after `patience` epochs without an
/// improvement of the monitored log, multiplies the optimizer's learning rate by `factor`, not
/// below `min_lr`, then waits `cooldown` epochs. Keras also writes `lr` into the epoch's logs;
/// here the logs are read-only, so read `model.optimizer().learning_rate()` instead.
/// \code
/// auto plateau = std::make_shared<ReduceLROnPlateau>(
///     ReduceLROnPlateauOptions{.factor = 0.5, .patience = 2});
/// \endcode
class ReduceLROnPlateau : public Callback {
 public:
  /// Throws `ConfigError` for a factor of 1 or more and for an unknown mode.
  LOADSTAR_DECL explicit ReduceLROnPlateau(ReduceLROnPlateauOptions options = {});

  std::string class_name() const override { return "ReduceLROnPlateau"; }
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  LOADSTAR_DECL void on_train_begin(const Logs&) override;

  LOADSTAR_DECL void on_epoch_end(std::size_t epoch, const Logs& logs) override;

  /// `{"best", "cooldown_counter", "wait"}`.
  nlohmann::json get_state() const override {
    return {{"best", best_}, {"cooldown_counter", cooldown_counter_}, {"wait", wait_}};
  }
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

 private:
  ReduceLROnPlateauOptions options_;
  bool resumed_ = false;
  bool maximize_ = false;
  double best_ = 0.0;
  std::size_t cooldown_counter_ = 0;
  std::size_t wait_ = 0;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions options)
    : options_(std::move(options)) {
  if (options_.factor >= 1.0) {
    throw ConfigError("reduce lr on plateau: factor must be below 1 but is " +
                      std::to_string(options_.factor));
  }
  const auto& m = options_.mode;
  if (m != "auto" && m != "min" && m != "max") {
    throw ConfigError("reduce lr on plateau: mode must be 'auto', 'min' or 'max' but is '" + m +
                      "'");
  }
  maximize_ = m == "max" || (m == "auto" && options_.monitor.find("acc") != std::string::npos);
}

nlohmann::json ReduceLROnPlateau::get_config() const {
  return {{"monitor", options_.monitor},   {"factor", options_.factor},
          {"patience", options_.patience}, {"verbose", options_.verbose},
          {"mode", options_.mode},         {"min_delta", options_.min_delta},
          {"cooldown", options_.cooldown}, {"min_lr", options_.min_lr}};
}

std::shared_ptr<Callback> ReduceLROnPlateau::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "ReduceLROnPlateau");
  const double factor = read.get("factor", 0.1);
  if (!(factor < 1.0)) read.fail("factor", "a number below 1");
  return std::make_shared<ReduceLROnPlateau>(
      ReduceLROnPlateauOptions{.monitor = read.get("monitor", "val_loss"),
                               .factor = factor,
                               .patience = read.get("patience", std::size_t{10}),
                               .verbose = read.get("verbose", 0),
                               .mode = detail::config_mode(read),
                               .min_delta = read.get("min_delta", 1e-4),
                               .cooldown = read.get("cooldown", std::size_t{0}),
                               .min_lr = read.get("min_lr", 0.0)});
}

void ReduceLROnPlateau::on_train_begin(const Logs&) {
  if (std::exchange(resumed_, false)) return;
  best_ = maximize_ ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  cooldown_counter_ = 0;
  wait_ = 0;
}

void ReduceLROnPlateau::on_epoch_end(std::size_t epoch, const Logs& logs) {
  const auto current = logs.get(options_.monitor);
  if (!current) {
    out() << "reduce lr on plateau: the metric '" << options_.monitor
          << "' is not in the logs, which hold: " << detail::joined_names(logs) << "\n";
    return;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    wait_ = 0;
  }
  const bool better =
      maximize_ ? *current > best_ + options_.min_delta : *current < best_ - options_.min_delta;
  if (better) {
    best_ = *current;
    wait_ = 0;
  } else if (cooldown_counter_ == 0) {
    ++wait_;
    if (wait_ >= options_.patience) {
      auto& optimizer = model().optimizer();
      const double old_lr = optimizer.learning_rate();
      if (old_lr > static_cast<double>(static_cast<float>(options_.min_lr))) {
        const double new_lr = std::max(old_lr * options_.factor, options_.min_lr);
        optimizer.set_learning_rate(new_lr);
        if (options_.verbose > 0) {
          out() << "\nEpoch " << detail::epoch_label(epoch)
                << ": ReduceLROnPlateau reducing learning rate to " << detail::general(new_lr)
                << ".\n";
        }
        cooldown_counter_ = options_.cooldown;
        wait_ = 0;
      }
    }
  }
}

void ReduceLROnPlateau::load_state(const nlohmann::json& state) {
  const detail::StateReader read("reduce lr on plateau", state);
  best_ = read.get<double>("best");
  cooldown_counter_ = read.get<std::size_t>("cooldown_counter");
  wait_ = read.get<std::size_t>("wait");
  resumed_ = true;
}

}  // namespace loadstar::keras::callbacks
#endif
