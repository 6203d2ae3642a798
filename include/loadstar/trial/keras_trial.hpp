/// \file
/// `KerasTrial`: Determined's `TFKerasTrial`, the class a user writes to be run as a trial.
#pragma once

#include <memory>
#include <vector>

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/trial/data_loader.hpp"
#include "loadstar/trial/invalid_hp.hpp"
#include "loadstar/trial/trial_context.hpp"

namespace loadstar::trial {

/// The base of a trial: the runner builds the training loader, the validation loader, the model
/// (which `build_model` compiles, after `context.wrap_model`) and the callbacks, in Determined's
/// order (`from_trial`), then trains it workload by workload.
/// \code
/// class MnistTrial : public trial::KerasTrial {
///  public:
///   using KerasTrial::KerasTrial;
///   std::shared_ptr<keras::Model> build_model() override { ... }
///   trial::DataLoader build_training_data_loader() override { return {x_train, y_train}; }
///   trial::DataLoader build_validation_data_loader() override { return {x_test, y_test}; }
/// };
/// LOADSTAR_REGISTER_TRIAL(MnistTrial, "model_def:MnistTrial");
/// \endcode
class KerasTrial {
 public:
  explicit KerasTrial(TrialContext& context) : context(context) {}
  virtual ~KerasTrial() = default;
  KerasTrial(const KerasTrial&) = delete;
  KerasTrial& operator=(const KerasTrial&) = delete;

  /// The compiled model (call `context.wrap_model(model)` before `compile`).
  virtual std::shared_ptr<keras::Model> build_model() = 0;
  virtual DataLoader build_training_data_loader() = 0;
  virtual DataLoader build_validation_data_loader() = 0;
  /// Keras callbacks and `trial::Callback`s, in the order their hooks run (the order must be the
  /// same on resume: states are restored by position).
  virtual std::vector<std::shared_ptr<keras::callbacks::Callback>> keras_callbacks() { return {}; }

 protected:
  TrialContext& context;
};

}  // namespace loadstar::trial
