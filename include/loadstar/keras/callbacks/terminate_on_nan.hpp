/// \file
/// `TerminateOnNaN`: stops training when the loss becomes NaN or infinite.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/model.hpp"

namespace loadstar::keras::callbacks {

/// Keras's `TerminateOnNaN`: after a training batch whose `loss` is NaN or infinite, prints
/// `Batch 3: Invalid loss, terminating training` and sets `model.stop_training`, so that `fit`
/// returns instead of throwing. `terminated()` tells whether it did.
/// \code
/// model.fit(x, y, {.callbacks = {std::make_shared<TerminateOnNaN>()}});
/// \endcode
class TerminateOnNaN : public Callback {
 public:
  std::string class_name() const override { return "TerminateOnNaN"; }
  /// The callback described by a config (`{}`; `Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  void on_train_begin(const Logs&) override { terminated_ = false; }

  LOADSTAR_DECL void on_train_batch_end(std::size_t batch, const Logs& logs) override;

  bool terminated() const noexcept { return terminated_; }

 private:
  bool terminated_ = false;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> TerminateOnNaN::from_config(const nlohmann::json& config) {
  static_cast<void>(detail::callback_config(config, "TerminateOnNaN"));
  return std::make_shared<TerminateOnNaN>();
}

void TerminateOnNaN::on_train_batch_end(std::size_t batch, const Logs& logs) {
  const auto loss = logs.get("loss");
  if (loss && !std::isfinite(*loss)) {
    out() << "Batch " << batch << ": Invalid loss, terminating training\n";
    terminated_ = true;
    model().stop_training = true;
  }
}

}  // namespace loadstar::keras::callbacks
#endif
