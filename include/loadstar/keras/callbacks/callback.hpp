/// \file
/// `Callback`: the base of Keras's callbacks, with every hook Keras calls.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <iostream>
#include <ostream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/callbacks/fit_loop.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/detail/params.hpp"

namespace loadstar::keras {
class Model;
}  // namespace loadstar::keras

namespace loadstar::keras::callbacks {

/// The base of every callback; each hook does nothing unless overridden. The hooks are Keras's,
/// called in Keras's order by `fit`, `evaluate` and `predict`. Setting
/// `model().stop_training = true` in a hook ends `fit` after the current batch's hooks (at the
/// end of the epoch when set in `on_epoch_end`), as Keras does.
class Callback {
 public:
  virtual ~Callback() = default;

  /// Called by `fit`, `evaluate` and `predict` before any other hook.
  virtual void set_model(Model& model) { model_ = &model; }
  Model& model() const { return *model_; }

  /// Keras's `set_params`: called by `fit`, `evaluate` and `predict` before their first hook.
  virtual void set_params(const CallbackParams& params) { params_ = params; }
  const CallbackParams& params() const noexcept { return params_; }

  /// Where the callback writes its messages: the stream `fit`, `evaluate` or `predict` was given
  /// (`output`), `std::cout` by default. Callbacks never write to standard error, so that a trial
  /// runner or an MPI rank can route or silence them.
  std::ostream& out() const { return params_.output ? *params_.output : std::cout; }

  /// The state a checkpoint keeps (Determined's `get_state`): JSON, null when the callback keeps
  /// none. `load_state` gives it back to a fresh callback before training resumes; the next
  /// `on_train_begin` then continues from it instead of starting over.
  virtual nlohmann::json get_state() const { return nullptr; }
  virtual void load_state(const nlohmann::json& /*state*/) {}

  /// The class name (`"EarlyStopping"`): the key of `Registry<Callback>`.
  virtual std::string class_name() const { return "Callback"; }
  /// The constructor arguments as a Keras-style config (`{"monitor": "val_loss", ...}`), which
  /// the class's `from_config` reads back.
  virtual nlohmann::json get_config() const { return nlohmann::json::object(); }

  virtual void on_train_begin(const Logs&) {}
  virtual void on_train_end(const Logs&) {}
  virtual void on_epoch_begin(std::size_t /*epoch*/, const Logs&) {}
  virtual void on_epoch_end(std::size_t /*epoch*/, const Logs&) {}
  virtual void on_train_batch_begin(std::size_t /*batch*/, const Logs&) {}
  virtual void on_train_batch_end(std::size_t /*batch*/, const Logs&) {}
  virtual void on_test_begin(const Logs&) {}
  virtual void on_test_end(const Logs&) {}
  virtual void on_test_batch_begin(std::size_t /*batch*/, const Logs&) {}
  virtual void on_test_batch_end(std::size_t /*batch*/, const Logs&) {}
  virtual void on_predict_begin(const Logs&) {}
  virtual void on_predict_end(const Logs&) {}
  virtual void on_predict_batch_begin(std::size_t /*batch*/, const Logs&) {}
  virtual void on_predict_batch_end(std::size_t /*batch*/, const Logs&) {}

  /// Loadstar's hooks for a callback that checkpoints training to resume it at the exact batch
  /// (`BackupAndRestore`), called by `fit` only: `on_fit_begin` before any callback's
  /// `on_train_begin`, where it may restore the model, `loop.data`, `loop.logs` and every
  /// callback's `load_state`, and move `loop.initial_epoch` forward; `on_fit_batch_end` after every
  /// callback's `on_train_batch_end`, and `on_fit_epoch_end` after every callback's `on_epoch_end`,
  /// where all the state training depends on is consistent and can be saved.
  virtual void on_fit_begin(FitLoop& /*loop*/) {}
  virtual void on_fit_batch_end(FitLoop& /*loop*/) {}
  virtual void on_fit_epoch_end(FitLoop& /*loop*/) {}

 protected:
  Callback() = default;
  Callback(const Callback&) = default;
  Callback(Callback&&) noexcept = default;
  Callback& operator=(const Callback&) = default;
  Callback& operator=(Callback&&) noexcept = default;

 private:
  Model* model_ = nullptr;
  CallbackParams params_{};
};

}  // namespace loadstar::keras::callbacks

namespace loadstar::keras::detail {

/// A reader of a callback's config whose errors name the callback (`callback (EarlyStopping)`).
inline ConfigReader callback_config(const nlohmann::json& config, std::string_view class_name) {
  return ConfigReader::of(config, "callback", class_name);
}

/// Reads `"auto"`, `"min"` or `"max"` from a config's `mode`.
LOADSTAR_DECL std::string config_mode(const ConfigReader& read);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::string config_mode(const ConfigReader& read) {
  std::string mode = read.get("mode", "auto");
  if (mode != "auto" && mode != "min" && mode != "max")
    read.fail("mode", "\"auto\", \"min\" or \"max\"");
  return mode;
}

}  // namespace loadstar::keras::detail
#endif
