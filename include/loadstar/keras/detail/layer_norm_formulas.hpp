/// \file
/// `LayerNormalization` over one line of `n` values (the trailing axes it normalises, one sample's
/// or one step's): its statistics, output and gradients, in double as the layer computes them.
/// Host and device code (`LOADSTAR_HOST_DEVICE`): `Backend::layer_norm_forward` and
/// `layer_norm_backward` call these on every backend.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>

namespace loadstar::keras::detail {

/// A line's mean and `1 / sqrt(variance + epsilon)` (the variance over `n`, Keras's).
struct LayerNormLine {
  double mean = 0.0;
  double inverse = 0.0;
};

/// The statistics of the line `x[0..n)`, its values added in order.
LOADSTAR_HOST_DEVICE inline LayerNormLine layer_norm_line(const float* x, std::size_t n,
                                                          float epsilon) noexcept {
  const auto count = static_cast<double>(n);
  double mean = 0.0;
  for (std::size_t e = 0; e < n; ++e)
    mean += x[e];
  mean /= count;
  double squares = 0.0;
  for (std::size_t e = 0; e < n; ++e) {
    const double d = x[e] - mean;
    squares += d * d;
  }
  return {mean, 1.0 / ::sqrt(squares / count + static_cast<double>(epsilon))};
}

/// Output `p` of a line: `xhat * gamma[p] + beta[p]` (`gamma`, `beta` null: 1 and 0).
LOADSTAR_HOST_DEVICE inline float layer_norm_value(float x, const LayerNormLine& s,
                                                   const float* gamma, const float* beta,
                                                   std::size_t p) noexcept {
  const double xhat = (x - s.mean) * s.inverse;
  return static_cast<float>(xhat * (gamma == nullptr ? 1.0 : gamma[p]) +
                            (beta == nullptr ? 0.0 : beta[p]));
}

/// `dy * gamma` at `p`, the gradient of the normalised value.
LOADSTAR_HOST_DEVICE inline double layer_norm_dxhat(float dy, const float* gamma,
                                                    std::size_t p) noexcept {
  return dy * (gamma == nullptr ? 1.0 : gamma[p]);
}

/// A line's sums for its input gradient: of `dxhat` and of `dxhat * xhat`, in order.
struct LayerNormSums {
  double dxhat = 0.0;
  double dxhat_xhat = 0.0;
};

LOADSTAR_HOST_DEVICE inline LayerNormSums layer_norm_sums(const float* x, const float* dy,
                                                          const float* gamma, std::size_t n,
                                                          const LayerNormLine& s) noexcept {
  LayerNormSums sums;
  for (std::size_t e = 0; e < n; ++e) {
    const double xhat = (x[e] - s.mean) * s.inverse;
    const double dxhat = layer_norm_dxhat(dy[e], gamma, e);
    sums.dxhat += dxhat;
    sums.dxhat_xhat += dxhat * xhat;
  }
  return sums;
}

/// The input gradient at `p` of a line of `n` values.
LOADSTAR_HOST_DEVICE inline float layer_norm_gradient(float x, float dy, const float* gamma,
                                                      std::size_t p, std::size_t n,
                                                      const LayerNormLine& s,
                                                      const LayerNormSums& sums) noexcept {
  const auto count = static_cast<double>(n);
  const double xhat = (x - s.mean) * s.inverse;
  const double dxhat = layer_norm_dxhat(dy, gamma, p);
  return static_cast<float>(s.inverse *
                            (dxhat - sums.dxhat / count - xhat * sums.dxhat_xhat / count));
}

/// `dy * xhat` at `p`: a line's share of `gamma`'s gradient.
LOADSTAR_HOST_DEVICE inline double layer_norm_dy_xhat(float x, float dy,
                                                      const LayerNormLine& s) noexcept {
  return dy * ((x - s.mean) * s.inverse);
}

}  // namespace loadstar::keras::detail
