/// \file
/// The element-wise activations and their gradients, one element at a time. Host and device code
/// (`LOADSTAR_HOST_DEVICE`): the CPU backend's kernels and the CUDA backend's compute the same
/// expressions. `keras::Activation` comes from the dependency-free kinds.hpp, so that the kernels
/// need none of the executor's headers.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>

#include "loadstar/keras/backend/kinds.hpp"

namespace loadstar::keras::detail {

/// The scaled exponential linear unit's constants (Klambauer et al. 2017, as in Keras).
inline constexpr float selu_alpha = 1.67326324235437728481704299167F;
inline constexpr float selu_scale = 1.05070098735548049341933498529F;

/// `std::max(a, b)` with its NaN behaviour (`a` unless `a < b`), unlike `fmaxf`.
LOADSTAR_HOST_DEVICE inline float max_of(float a, float b) noexcept {
  return a < b ? b : a;
}

/// `std::clamp(v, low, high)`.
LOADSTAR_HOST_DEVICE inline float clamp_to(float v, float low, float high) noexcept {
  return v < low ? low : high < v ? high : v;
}

LOADSTAR_HOST_DEVICE inline float sigmoid(float x) noexcept {
  return 1.0F / (1.0F + ::expf(-x));
}

/// Whether a ReLU passes its gradient on at output `y`: where `y` is positive (not at 0, not for
/// NaN). A kernel that carries a following ReLU's gradient (a pooling's) tests the same.
LOADSTAR_HOST_DEVICE inline bool relu_passes(float y) noexcept {
  return y > 0.0F;
}

/// `f(x)` of an element-wise activation (softmax and linear give `x`).
LOADSTAR_HOST_DEVICE inline float activate(Activation kind, float x) noexcept {
  switch (kind) {
    case Activation::linear:
    case Activation::softmax:
      return x;
    case Activation::relu:
      return x > 0.0F ? x : 0.0F;
    case Activation::sigmoid:
      return sigmoid(x);
    case Activation::tanh:
      return ::tanhf(x);
    case Activation::elu:
      return x > 0.0F ? x : ::expm1f(x);
    case Activation::selu:
      return x > 0.0F ? selu_scale * x : selu_scale * selu_alpha * ::expm1f(x);
    case Activation::softplus:
      return ::log1pf(::expf(-::fabsf(x))) + max_of(x, 0.0F);
    case Activation::softsign:
      return x / (1.0F + ::fabsf(x));
    case Activation::gelu:
      return 0.5F * x * (1.0F + ::erff(x * 0.70710678118654752F));
    case Activation::swish:
      return x * sigmoid(x);
    case Activation::hard_sigmoid:
      return clamp_to(0.2F * x + 0.5F, 0.0F, 1.0F);
    case Activation::exponential:
      return ::expf(x);
    case Activation::relu6:
      return x > 0.0F ? (x < 6.0F ? x : 6.0F) : 0.0F;
    case Activation::leaky_relu:
      return x > 0.0F ? x : 0.2F * x;
    case Activation::mish:
      return x * ::tanhf(::log1pf(::expf(-::fabsf(x))) + max_of(x, 0.0F));
    case Activation::hard_silu:
      return x * clamp_to(x + 3.0F, 0.0F, 6.0F) / 6.0F;
    case Activation::log_sigmoid:
      return -(::log1pf(::expf(-::fabsf(x))) + max_of(-x, 0.0F));
    case Activation::hard_tanh:
      return clamp_to(x, -1.0F, 1.0F);
    case Activation::tanh_shrink:
      return x - ::tanhf(x);
    case Activation::soft_shrink:
      return x > 0.5F ? x - 0.5F : x < -0.5F ? x + 0.5F : 0.0F * x;
    case Activation::hard_shrink:
      return x > 0.5F || x < -0.5F ? x : 0.0F * x;
    case Activation::squareplus:
      return 0.5F * (x + ::sqrtf(x * x + 4.0F));
    case Activation::sparse_plus:
      return x <= -1.0F ? 0.0F * x : x >= 1.0F ? x : 0.25F * (x + 1.0F) * (x + 1.0F);
  }
  return x;
}

/// The derivative times `dy`, from the output `y` (and the input `x` for the activations
/// `activation_gradient_needs_input` names). At the kinks, the one-sided derivative PyTorch takes.
LOADSTAR_HOST_DEVICE inline float activation_gradient(Activation kind, float x, float y,
                                                      float dy) noexcept {
  switch (kind) {
    case Activation::linear:
    case Activation::softmax:
      return dy;
    case Activation::relu:
      return relu_passes(y) ? dy : 0.0F;
    case Activation::sigmoid:
      return dy * y * (1.0F - y);
    case Activation::tanh:
      return dy * (1.0F - y * y);
    case Activation::elu:
      return y > 0.0F ? dy : dy * (y + 1.0F);
    case Activation::selu:
      return y > 0.0F ? dy * selu_scale : dy * (y + selu_scale * selu_alpha);
    case Activation::softplus:  // softplus' = sigmoid(x) = 1 - exp(-y)
      return -dy * ::expm1f(-y);
    case Activation::softsign:  // softsign' = 1 / (1 + |x|)^2 = (1 - |y|)^2
      return dy * (1.0F - ::fabsf(y)) * (1.0F - ::fabsf(y));
    case Activation::gelu: {
      const float cdf = 0.5F * (1.0F + ::erff(x * 0.70710678118654752F));
      const float pdf = 0.39894228040143268F * ::expf(-0.5F * x * x);
      return dy * (cdf + x * pdf);
    }
    case Activation::swish: {
      const float s = sigmoid(x);
      return dy * (s + x * s * (1.0F - s));
    }
    case Activation::hard_sigmoid:
      return y > 0.0F && y < 1.0F ? 0.2F * dy : 0.0F;
    case Activation::exponential:
      return dy * y;
    case Activation::relu6:
      return y > 0.0F && y < 6.0F ? dy : 0.0F;
    case Activation::leaky_relu:
      return y > 0.0F ? dy : 0.2F * dy;
    case Activation::mish: {
      const float t = ::tanhf(::log1pf(::expf(-::fabsf(x))) + max_of(x, 0.0F));
      return dy * (t + x * (1.0F - t * t) * sigmoid(x));
    }
    case Activation::hard_silu:
      return x < -3.0F ? 0.0F : x <= 3.0F ? dy * (x / 3.0F + 0.5F) : dy;
    case Activation::log_sigmoid:  // log_sigmoid' = sigmoid(-x) = 1 - exp(y)
      return -dy * ::expm1f(y);
    case Activation::hard_tanh:
      return y > -1.0F && y < 1.0F ? dy : 0.0F;
    case Activation::tanh_shrink: {
      const float t = ::tanhf(x);
      return dy * t * t;
    }
    case Activation::soft_shrink:
    case Activation::hard_shrink:
      return y != 0.0F ? dy : 0.0F;
    case Activation::squareplus:
      return dy * 0.5F * (1.0F + x / ::sqrtf(x * x + 4.0F));
    case Activation::sparse_plus:  // (x + 1) / 2 = sqrt(y) between -1 and 1
      return y >= 1.0F ? dy : y > 0.0F ? dy * ::sqrtf(y) : 0.0F;
  }
  return dy;
}

}  // namespace loadstar::keras::detail
