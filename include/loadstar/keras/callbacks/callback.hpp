/// \file
/// `Callback`: the base of Keras's callbacks, with every hook Keras calls.
#pragma once

#include <cstddef>

#include "loadstar/keras/callbacks/logs.hpp"

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

 protected:
  Callback() = default;
  Callback(const Callback&) = default;
  Callback(Callback&&) noexcept = default;
  Callback& operator=(const Callback&) = default;
  Callback& operator=(Callback&&) noexcept = default;

 private:
  Model* model_ = nullptr;
};

}  // namespace loadstar::keras::callbacks
