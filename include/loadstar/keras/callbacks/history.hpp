/// \file
/// `History`: every epoch's logs, as Keras's `model.fit(...).history`.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loadstar/keras/callbacks/callback.hpp"

namespace loadstar::keras::callbacks {

/// Records the logs of every epoch: `history["loss"][e]`, `history["val_accuracy"][e]`, and the
/// epoch numbers in `epoch`. `fit` always records one and returns it, as Keras does.
/// \code
/// History history = model.fit(x, y, {.epochs = 3, .validation_split = 0.1});
/// double last = history.history.at("val_loss").back();
/// \endcode
class History : public Callback {
 public:
  /// Values per log name, one per epoch run.
  std::map<std::string, std::vector<double>> history;
  /// The epochs run (0-based, as Keras's `history.epoch`).
  std::vector<std::size_t> epoch;

  std::string class_name() const override { return "History"; }
  /// The callback described by a config (`{}`; `Registry<Callback>`'s factory).
  static std::shared_ptr<Callback> from_config(const nlohmann::json& config) {
    static_cast<void>(detail::callback_config(config, "History"));
    return std::make_shared<History>();
  }

  void on_train_begin(const Logs&) override {
    history.clear();
    epoch.clear();
  }

  void on_epoch_end(std::size_t index, const Logs& logs) override {
    epoch.push_back(index);
    for (const auto& [name, value] : logs)
      history[name].push_back(value);
  }
};

}  // namespace loadstar::keras::callbacks
