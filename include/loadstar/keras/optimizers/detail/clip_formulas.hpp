/// \file
/// The optimizers' gradient clipping (Keras 2.11+'s `_clip_gradients`) as per-element and
/// per-variable formulas. Host and device code (`LOADSTAR_HOST_DEVICE`): the optimizers on the
/// host (optimizer_base.hpp) and the CUDA backend's fused optimizer step (cuda/detail/
/// step_math.hpp) compute the same expressions.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>

namespace loadstar::keras::detail {

/// The scale a gradient of squared norm `squares` is multiplied by to have at most the norm
/// `threshold`: `threshold / max(norm, threshold)` in double, rounded to float.
LOADSTAR_HOST_DEVICE inline float clip_scale(double squares, double threshold) noexcept {
  const double norm = ::sqrt(squares);
  return static_cast<float>(threshold / (norm < threshold ? threshold : norm));
}

/// The gradient clipped to `[-c, c]`: one element of Eigen's `gradient.max(-c).min(c)`, which the
/// host optimizers compute a block at a time.
LOADSTAR_HOST_DEVICE inline float clip_to_value(float g, float c) noexcept {
  const float low = g < -c ? -c : g;
  return c < low ? c : low;
}

}  // namespace loadstar::keras::detail
