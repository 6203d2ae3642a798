/// \file
/// `LearningRateScheduler`: sets the learning rate at the start of every epoch.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/model.hpp"

namespace loadstar::keras::callbacks {

/// Keras's `LearningRateScheduler`: at the start of each epoch, sets the optimizer's learning
/// rate to `schedule(epoch, current_learning_rate)`.
/// \code
/// auto scheduler = std::make_shared<LearningRateScheduler>(
///     [](std::size_t epoch, double lr) { return epoch < 10 ? lr : lr * 0.9; });
/// \endcode
class LearningRateScheduler : public Callback {
 public:
  using Schedule = std::function<double(std::size_t epoch, double learning_rate)>;

  explicit LearningRateScheduler(Schedule schedule, int verbose = 0)
      : schedule_(std::move(schedule)), verbose_(verbose) {}

  std::string class_name() const override { return "LearningRateScheduler"; }
  nlohmann::json get_config() const override { return {{"verbose", verbose_}}; }
  /// Throws `ConfigError`: the schedule is a function, which a config cannot hold.
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json&);

  LOADSTAR_DECL void on_epoch_begin(std::size_t epoch, const Logs&) override;

 private:
  Schedule schedule_;
  int verbose_;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> LearningRateScheduler::from_config(const nlohmann::json&) {
  throw ConfigError(
      "callback (LearningRateScheduler): holds a function (schedule) and cannot be built from "
      "a config; construct it in code, or pass a factory in the custom objects");
}

void LearningRateScheduler::on_epoch_begin(std::size_t epoch, const Logs&) {
  auto& optimizer = model().optimizer();
  const double lr = schedule_(epoch, optimizer.learning_rate());
  optimizer.set_learning_rate(lr);
  if (verbose_ > 0) {
    out() << "\nEpoch " << detail::epoch_label(epoch)
          << ": LearningRateScheduler setting learning rate to " << detail::general(lr) << ".\n";
  }
}

}  // namespace loadstar::keras::callbacks
#endif
