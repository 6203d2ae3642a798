/// \file
/// `Regularizer`: the base of Keras's weight and activity regularizers.
#pragma once

#include "loadstar/config.hpp"

#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The base of every regularizer (Keras's `keras.regularizers.Regularizer`): a penalty of a
/// weight (`kernel_regularizer`, ...) or of a layer's output (`activity_regularizer`), added to
/// the training and evaluation loss as Keras adds `model.losses`, with its gradient.
///
/// `penalty` and `add_gradient` compute on host tensors; `penalty_on` and `add_gradient_on` run
/// them on a backend's tensors through `Backend::host_kernel`.
/// \code
/// auto dense = std::make_shared<Dense>(10);
/// dense->set_regularizer("kernel", std::make_shared<regularizers::L2>(0.01));
/// \endcode
class Regularizer {
 public:
  Regularizer() = default;
  virtual ~Regularizer() = default;
  Regularizer(const Regularizer&) = default;
  Regularizer& operator=(const Regularizer&) = default;
  Regularizer(Regularizer&&) noexcept = default;
  Regularizer& operator=(Regularizer&&) noexcept = default;

  /// Keras's class name (`"L2"`): the key of the regularizer registry.
  virtual std::string class_name() const = 0;
  /// Keras's `get_config()` (`{"l2": 0.01}`).
  virtual nlohmann::json get_config() const = 0;

  /// The penalty of `x` (host memory).
  virtual double penalty(const Tensor<float>& x) const = 0;
  /// Adds `scale` times the gradient of the penalty at `x` into `gradient` (host memory, the
  /// shape of `x`).
  virtual void add_gradient(const Tensor<float>& x, double scale,
                            const Tensor<float>& gradient) const = 0;
  /// Throws `ConfigError` naming `owner` when the regularizer does not apply to a tensor of
  /// `shape` (`OrthogonalRegularizer` takes matrices only); every shape by default.
  virtual void check_shape(const Shape& /*shape*/, const std::string& /*owner*/) const {}

  /// `{"class_name": ..., "config": ...}`, as tf.keras serialises it (Keras 3's files add
  /// `module` and `registered_name`, keras/saving).
  nlohmann::json to_json() const {
    return {{"class_name", class_name()}, {"config", get_config()}};
  }

  /// `penalty` of `x`, a tensor in `backend`'s memory.
  LOADSTAR_DECL double penalty_on(Backend& backend, const Tensor<float>& x) const;
  /// `add_gradient` on tensors in `backend`'s memory.
  LOADSTAR_DECL void add_gradient_on(Backend& backend, const Tensor<float>& x, double scale,
                                     const Tensor<float>& gradient) const;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

double Regularizer::penalty_on(Backend& backend, const Tensor<float>& x) const {
  double result = 0.0;
  const Tensor<float> tensors[] = {x};
  backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) { result = penalty(t[0]); });
  return result;
}

void Regularizer::add_gradient_on(Backend& backend, const Tensor<float>& x, double scale,
                                  const Tensor<float>& gradient) const {
  const Tensor<float> tensors[] = {x, gradient};
  backend.host_kernel(tensors,
                      [&](std::span<const Tensor<float>> t) { add_gradient(t[0], scale, t[1]); });
}

}  // namespace loadstar::keras
#endif
