/// \file
/// `History`: every epoch's logs, as Keras's `model.fit(...).history`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"

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
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  LOADSTAR_DECL void on_train_begin(const Logs&) override;

  /// `{"history": {name: [values]}, "epoch": [epochs]}`: a resumed `fit` returns the whole run's
  /// history.
  nlohmann::json get_state() const override { return {{"history", history}, {"epoch", epoch}}; }
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  LOADSTAR_DECL void on_epoch_end(std::size_t index, const Logs& logs) override;

 private:
  bool resumed_ = false;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> History::from_config(const nlohmann::json& config) {
  static_cast<void>(detail::callback_config(config, "History"));
  return std::make_shared<History>();
}

void History::on_train_begin(const Logs&) {
  if (std::exchange(resumed_, false)) return;
  history.clear();
  epoch.clear();
}

void History::load_state(const nlohmann::json& state) {
  const detail::StateReader read("history", state);
  const auto saved = read.get<nlohmann::json>("history");
  const auto epochs = read.get<nlohmann::json>("epoch");
  try {
    history = saved.get<std::map<std::string, std::vector<double>>>();
    epoch = epochs.get<std::vector<std::size_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("history state: expected lists of numbers but found " +
                          loadstar::detail::shown(state) + " (" + e.what() + ")");
  }
  resumed_ = true;
}

void History::on_epoch_end(std::size_t index, const Logs& logs) {
  epoch.push_back(index);
  for (const auto& [name, value] : logs)
    history[name].push_back(value);
}

}  // namespace loadstar::keras::callbacks
#endif
