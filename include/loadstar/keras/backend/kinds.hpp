/// \file
/// The enumerations and geometry structs that the executor and every backend's kernels share:
/// the activations, the optimizers' element-wise rules and their operands, the row losses, the mean
/// metrics and the convolution and pooling geometry. Dependency-free (it includes only config.hpp
/// and
/// `<cstddef>`), so that the CUDA kernels, compiled by nvcc, use these very types and need none
/// of the executor's headers.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>

namespace loadstar::keras {

/// An activation function of `tf.keras.activations` (Keras 2 semantics).
///
/// `gelu` is the exact (erf) form, Keras's default `approximate=False`; `hard_sigmoid` is Keras 2's
/// `max(0, min(1, 0.2 x + 0.5))`; `softmax` acts over the last axis.
/// \code
/// Activation a = activation_from_name("relu");
/// activation_name(a);  // "relu"
/// \endcode
enum class Activation {
  linear,
  relu,
  sigmoid,
  tanh,
  softmax,
  elu,
  selu,
  softplus,
  softsign,
  gelu,
  swish,
  hard_sigmoid,
  exponential,
  relu6,
  leaky_relu,  ///< Keras's `leaky_relu` activation: negative slope 0.2
  mish,
  hard_silu,  ///< `x * relu6(x + 3) / 6` (Keras 3's `hard_silu`, alias `hard_swish`)
  log_sigmoid,
  hard_tanh,
  tanh_shrink,
  soft_shrink,  ///< threshold 0.5
  hard_shrink,  ///< threshold 0.5
  squareplus,   ///< `(x + sqrt(x^2 + 4)) / 2`
  sparse_plus,
};

/// The element-wise rule of an optimizer step (`Backend::apply_optimizer_step`), one per
/// optimizer in keras/optimizers/ and its variants.
enum class UpdateRule {
  sgd,           ///< `w -= lr * g`
  sgd_momentum,  ///< slot `velocity`; `w += velocity` (Nesterov: `momentum * velocity - lr * g`)
  adam,          ///< slots `m`, `v` (and `vhat` with `amsgrad`); AdamW when `weight_decay` is set
  rmsprop,       ///< slots `velocity`, then `momentum` when `momentum > 0`, then `average_gradient`
  adagrad,       ///< slot `accumulator`
  adadelta,      ///< slots `accumulated_grad`, `accumulated_delta_var`
  nadam,         ///< slots `momentum`, `velocity`
  adamax,        ///< slots `momentum`, `norm`
  lion,          ///< slot `momentum`
  ftrl,          ///< slots `accumulator`, `linear`
};

/// One optimizer step's operands: the floats an optimizer computes once per step from its options
/// and the iteration (bias corrections in double, then rounded to float once), which every
/// element's update reads.
struct UpdateOperands {
  UpdateRule rule = UpdateRule::sgd;
  float learning_rate = 0.0F;
  /// Adam: `lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
  float alpha = 0.0F;
  /// Adam: `1 - beta_1` and `1 - beta_2`.
  float one_minus_beta_1 = 0.0F, one_minus_beta_2 = 0.0F;
  /// SGD and RMSprop: the momentum (0: none).
  float momentum = 0.0F;
  /// RMSprop and Adadelta: the decay of the running averages.
  float rho = 0.0F;
  float epsilon = 0.0F;
  /// `lr * weight_decay`, applied as `w -= w * weight_decay` before any rule's step (0: none).
  float weight_decay = 0.0F;
  /// Adamax and Lion: `beta_1`, `beta_2`; Adamax's `alpha` is `lr / (1 - beta_1^t)`.
  float beta_1 = 0.0F, beta_2 = 0.0F;
  /// Nadam: the momentum's coefficient `u_{t+1} / (1 - prod_{i<=t+1} u_i)`, the gradient's
  /// `(1 - u_t) / (1 - prod_{i<=t} u_i)` and the velocity's bias correction `1 - beta_2^t`.
  float momentum_coefficient = 0.0F, gradient_coefficient = 0.0F, velocity_correction = 0.0F;
  /// Ftrl: `-learning_rate_power`, the L1 strength, `2 * (l2 + beta / (2 lr))` and
  /// `2 * l2_shrinkage`.
  float accumulator_power = 0.0F, l1 = 0.0F, twice_l2 = 0.0F, twice_l2_shrinkage = 0.0F;
  bool nesterov = false;
  bool amsgrad = false;
  bool centered = false;
};

/// What a row loss computes (`Backend::row_loss`): the loss of each last-axis row of `y_pred`
/// and its gradient, as the loss classes in keras/losses/ do on the host.
enum class RowLossKind {
  sparse_categorical_crossentropy,
  categorical_crossentropy,
  mean_squared_error,
  binary_crossentropy,
  mean_absolute_error,
  huber,
  kl_divergence,
};

/// A metric that is the weighted mean of one value per row (`Backend::mean_metric`).
enum class MeanMetricKind {
  accuracy,              ///< per element: `y_true == y_pred`
  binary_accuracy,       ///< per element of a row, averaged: `(y_pred > threshold) == y_true`
  categorical_accuracy,  ///< `argmax(y_true) == argmax(y_pred)`
  sparse_categorical_accuracy,  ///< `y_true == argmax(y_pred)`
  mean,                         ///< per element: `y_pred`
  mean_squared_error,           ///< `mean(square(y_true - y_pred))` of each row
  mean_absolute_error,          ///< `mean(abs(y_true - y_pred))` of each row
};

/// The geometry of a 2-D convolution over channels-last inputs `(batch, in_h, in_w, in_c)` with a
/// kernel `(kernel_h, kernel_w, in_c, out_c)` (Keras's layout) giving `(batch, out_h, out_w,
/// out_c)`.
struct Conv2DGeometry {
  std::size_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  std::size_t out_h = 0, out_w = 0, out_c = 0;
  std::size_t kernel_h = 1, kernel_w = 1;
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t dilation_h = 1, dilation_w = 1;
  /// Zero padding before the first row and column (TensorFlow's rule: `total / 2`).
  std::size_t pad_top = 0, pad_left = 0;

  /// The number of columns of one im2col row: `kernel_h * kernel_w * in_c`.
  LOADSTAR_HOST_DEVICE std::size_t patch_size() const noexcept {
    return kernel_h * kernel_w * in_c;
  }
};

/// The geometry of a 2-D pooling over channels-last inputs.
struct Pool2DGeometry {
  std::size_t batch = 0, in_h = 0, in_w = 0, channels = 0;
  std::size_t out_h = 0, out_w = 0;
  std::size_t pool_h = 1, pool_w = 1;
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t pad_top = 0, pad_left = 0;
};

}  // namespace loadstar::keras
