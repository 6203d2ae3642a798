/// \file
/// The per-element formulas of the layers' kernels other than the activations
/// (activation_formulas.hpp): Keras's `ReLU` layer, inverted dropout's counter-based mask, batch
/// normalization and its moving averages, softmax along one line, a gather index's range and a
/// column sum's rounding. Host and device code (`LOADSTAR_HOST_DEVICE`): `CpuBackend` and the CUDA
/// backend's kernels (cuda/detail/math.hpp) call these same functions, so that both compute the
/// same expressions in the same order and give the same bits.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loadstar/keras/detail/activation_formulas.hpp"
#include "loadstar/random.hpp"

namespace loadstar::keras::detail {

/// Keras's `ReLU`: `top` for `v >= top`, `v` from `threshold` on, `slope * (v - threshold)`
/// below (`top` is infinity without a `max_value`).
LOADSTAR_HOST_DEVICE inline float relu_value(float v, float top, float slope,
                                             float threshold) noexcept {
  return v >= top ? top : v >= threshold ? v : slope * (v - threshold);
}

/// The gradient of `relu_value` at `v` times `dy`.
LOADSTAR_HOST_DEVICE inline float relu_gradient(float v, float dy, float top, float slope,
                                                float threshold) noexcept {
  return v >= top ? 0.0F : v >= threshold ? dy : slope * dy;
}

/// Keras's `ELU` layer: `v` above 0, `alpha * (exp(v) - 1)` at or below.
LOADSTAR_HOST_DEVICE inline float elu_layer_value(float v, float alpha) noexcept {
  return v > 0.0F ? v : alpha * (::expf(v) - 1.0F);
}

/// The gradient of `elu_layer_value` at `v` times `dy`: `dy` above 0, `dy * alpha * exp(v)` below.
LOADSTAR_HOST_DEVICE inline float elu_layer_gradient(float v, float dy, float alpha) noexcept {
  return v > 0.0F ? dy : dy * alpha * ::expf(v);
}

/// tf.keras's `ThresholdedReLU`: `v` above `theta`, else 0; its gradient `dy` there, else 0.
LOADSTAR_HOST_DEVICE inline float thresholded_relu_value(float v, float theta) noexcept {
  return v > theta ? v : 0.0F;
}

/// Keras's `PReLU` (`relu(v) - alpha * relu(-v)`): `v` above 0, `alpha * v` below.
LOADSTAR_HOST_DEVICE inline float prelu_value(float v, float alpha) noexcept {
  return v > 0.0F ? v : v < 0.0F ? alpha * v : 0.0F;
}

/// The gradient of `prelu_value` with respect to `v` times `dy` (0 at 0, as TensorFlow's relu).
LOADSTAR_HOST_DEVICE inline float prelu_gradient(float v, float dy, float alpha) noexcept {
  return v > 0.0F ? dy : v < 0.0F ? alpha * dy : 0.0F;
}

/// A uniform double in `[0, 1)` for element `i` under `key`: the top 53 bits of
/// `mix64(key + golden_gamma * (i + 1))`, the same draw as `dropout_keeps`.
LOADSTAR_HOST_DEVICE inline double uniform_at(std::uint64_t key, std::uint64_t i) noexcept {
  return static_cast<double>(mix64(key + golden_gamma * (i + 1)) >> 11U) * 0x1.0p-53;
}

/// A standard normal float for element `i` under `key` (Box-Muller on two counter-based uniforms
/// of the streams `2 i` and `2 i + 1`), so that it depends on `(key, i)` alone.
LOADSTAR_HOST_DEVICE inline float normal_at(std::uint64_t key, std::uint64_t i) noexcept {
  const double u1 = 1.0 - uniform_at(key, 2 * i);  // in (0, 1]: the logarithm is finite
  const double u2 = uniform_at(key, 2 * i + 1);
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2));
}

/// Whether inverted dropout keeps element `i` under `key`: a counter-based hash, so that element
/// `i` depends on `(key, i)` alone whatever the thread split; a uniform double from the top 53
/// bits of `mix64(key + golden_gamma * (i + 1))` at or above `rate`.
LOADSTAR_HOST_DEVICE inline bool dropout_keeps(std::uint64_t key, std::uint64_t i,
                                               double rate) noexcept {
  const std::uint64_t bits = mix64(key + golden_gamma * (i + 1));
  const double u = static_cast<double>(bits >> 11U) * 0x1.0p-53;
  return u >= rate;
}

/// The dropout output of `x`: `x * keep_scale` when kept, else 0.
LOADSTAR_HOST_DEVICE inline float dropout_value(float x, std::uint64_t key, std::uint64_t i,
                                                double rate, float keep_scale) noexcept {
  return dropout_keeps(key, i, rate) ? x * keep_scale : 0.0F;
}

/// `moving * momentum + value * (1 - momentum)`.
LOADSTAR_HOST_DEVICE inline float moving_average_value(float moving, float value,
                                                       float momentum) noexcept {
  return moving * momentum + value * (1.0F - momentum);
}

/// `gamma * (x - mean) / sqrt(variance + epsilon) + beta`, as `(x - mean) * inv * gamma + beta`
/// with `inv` rounded to float.
LOADSTAR_HOST_DEVICE inline float batch_norm_value(float x, float mean, float variance, float gamma,
                                                   float beta, float epsilon) noexcept {
  const float inv = 1.0F / ::sqrtf(variance + epsilon);
  return (x - mean) * inv * gamma + beta;
}

/// `(x - mean)^2` in double: one term of a column's variance (`Backend::moments`).
LOADSTAR_HOST_DEVICE inline double squared_deviation(float x, double mean) noexcept {
  const double d = x - mean;
  return d * d;
}

/// `1 / sqrt(variance + epsilon)` in double: batch normalization's scale in its backward pass.
LOADSTAR_HOST_DEVICE inline double batch_norm_inverse_std(float variance, float epsilon) noexcept {
  return 1.0 / ::sqrt(double(variance) + epsilon);
}

/// The input gradient of batch normalization for one element: with the batch's statistics
/// (`training`) `gamma * inv * (dy - sum_dy / n - xhat * sum_dy_xhat / n)`, else
/// `gamma * inv * dy`, in double.
LOADSTAR_HOST_DEVICE inline float batch_norm_gradient(float x, float mean, float variance,
                                                      double gamma, float epsilon, bool training,
                                                      float dy, double sum_dy, double sum_dy_xhat,
                                                      double n) noexcept {
  const double inv = batch_norm_inverse_std(variance, epsilon);
  const double d = dy;
  if (!training) return static_cast<float>(gamma * inv * d);
  const double xhat = (x - mean) * inv;
  return static_cast<float>(gamma * inv * (d - sum_dy / n - xhat * sum_dy_xhat / n));
}

/// The value that batch normalization's backward pass sums for `dgamma`: `dy * (x - mean) * inv`.
LOADSTAR_HOST_DEVICE inline double batch_norm_dy_xhat(float x, float mean, float dy,
                                                      double inv) noexcept {
  return double(dy) * (x - mean) * inv;
}

/// Whether a gather index (a float, cast toward zero as `tf.cast` does) is inside `[0, rows)`;
/// NaN is not.
LOADSTAR_HOST_DEVICE inline bool index_in_range(float v, std::size_t rows) noexcept {
  return v > -1.0F && v < static_cast<float>(rows);
}

/// A column sum's result from the column's sum in double: `sum`, or `beta * old + sum`, rounded
/// to float once.
LOADSTAR_HOST_DEVICE inline float column_sum_value(double sum, float beta, float old) noexcept {
  return static_cast<float>(beta == 0.0F ? sum : beta * old + sum);
}

/// `y = softmax(x)` along line `line` of a tensor seen as `(outer, length, inner)`: the line's
/// maximum subtracted, the exponentials summed in order, each divided by the sum.
LOADSTAR_HOST_DEVICE inline void softmax_forward_line(const float* x, float* y, std::size_t length,
                                                      std::size_t inner,
                                                      std::size_t line) noexcept {
  const std::size_t base = (line / inner) * length * inner + line % inner;
  const float* in = x + base;
  float* out = y + base;
  float top = -INFINITY;
  for (std::size_t k = 0; k < length; ++k)
    top = max_of(top, in[k * inner]);
  float sum = 0.0F;
  for (std::size_t k = 0; k < length; ++k) {
    const float e = ::expf(in[k * inner] - top);
    out[k * inner] = e;
    sum += e;
  }
  for (std::size_t k = 0; k < length; ++k)
    out[k * inner] /= sum;
}

/// `dx = y * (dy - sum(dy * y))` along line `line`.
LOADSTAR_HOST_DEVICE inline void softmax_backward_line(const float* y, const float* dy, float* dx,
                                                       std::size_t length, std::size_t inner,
                                                       std::size_t line) noexcept {
  const std::size_t base = (line / inner) * length * inner + line % inner;
  float dot = 0.0F;
  for (std::size_t k = 0; k < length; ++k)
    dot += y[base + k * inner] * dy[base + k * inner];
  for (std::size_t k = 0; k < length; ++k) {
    const std::size_t i = base + k * inner;
    dx[i] = y[i] * (dy[i] - dot);
  }
}

}  // namespace loadstar::keras::detail
