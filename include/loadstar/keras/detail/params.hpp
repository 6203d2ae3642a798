/// \file
/// What `fit`, `evaluate` and `predict` tell the callbacks that ask (Keras's `callback.params`).
#pragma once

#include <cstddef>
#include <optional>

namespace loadstar::keras {

/// Keras's `callback.params`: the verbosity, the number of epochs and the steps of an epoch (or
/// of an evaluation or prediction pass; empty when unknown before the pass ends).
struct CallbackParams {
  int verbose = 1;
  std::size_t epochs = 1;
  std::optional<std::size_t> steps;
};

namespace detail {

/// Implemented by callbacks that read `params` (the progress bar); the model sets them before
/// `on_train_begin`, `on_test_begin` and `on_predict_begin`.
class ParamsReceiver {
 public:
  virtual ~ParamsReceiver() = default;
  virtual void set_params(const CallbackParams& params) = 0;

 protected:
  ParamsReceiver() = default;
  ParamsReceiver(const ParamsReceiver&) = default;
  ParamsReceiver& operator=(const ParamsReceiver&) = default;
};

}  // namespace detail
}  // namespace loadstar::keras
