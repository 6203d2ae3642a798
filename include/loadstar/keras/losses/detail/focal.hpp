/// \file
/// What the focal losses share: their argument checks and the derivative of the focal factor.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// Throws `ConfigError` naming `owner` for `gamma` below 0, or `alpha` or `label_smoothing`
/// outside [0, 1] (Keras documents these ranges).
LOADSTAR_DECL void check_focal_arguments(const std::string& owner, double alpha, double gamma,
                                         double label_smoothing);

/// `d(x ** gamma) / dx` for `x` in [0, 1]: 0 for `gamma` 0 (the factor is 1).
inline double power_derivative(double x, double gamma) {
  return gamma == 0 ? 0.0 : gamma * std::pow(x, gamma - 1.0);
}

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void check_focal_arguments(const std::string& owner, double alpha, double gamma,
                           double label_smoothing) {
  const auto fail = [&](const char* what, const char* expected, double value) {
    throw ConfigError(owner + ": " + what + " must be " + expected + " but is " +
                      nlohmann::json(value).dump());
  };
  if (!(gamma >= 0)) fail("gamma", "at least 0", gamma);
  if (!(alpha >= 0 && alpha <= 1)) fail("alpha", "in [0, 1]", alpha);
  if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
    fail("label_smoothing", "in [0, 1]", label_smoothing);
  }
}

}  // namespace loadstar::keras::detail
#endif
