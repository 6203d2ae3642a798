/// \file
/// `MeanSquaredLogarithmicError`: `mean((log(maximum(y_pred, epsilon) + 1) - log(maximum(y_true,
/// epsilon) + 1))^2, axis=-1)`, as `keras.losses.MeanSquaredLogarithmicError`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The mean squared logarithmic error, with Keras's epsilon of 1e-7.
/// \code
/// losses::MeanSquaredLogarithmicError loss;
/// \endcode
class MeanSquaredLogarithmicError : public detail::RowLoss<MeanSquaredLogarithmicError> {
 public:
  explicit MeanSquaredLogarithmicError(Reduction reduction = Reduction::sum_over_batch_size,
                                       std::string name = "mean_squared_logarithmic_error")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "MeanSquaredLogarithmicError"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> MeanSquaredLogarithmicError::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "MeanSquaredLogarithmicError");
  return std::make_unique<MeanSquaredLogarithmicError>(
      detail::config_reduction(read), read.get("name", "mean_squared_logarithmic_error"));
}

double MeanSquaredLogarithmicError::row(const float* t, const float* p, std::size_t n, float* g,
                                        double scale) const {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double clipped = std::max(static_cast<double>(p[i]), 1e-7);
    const double e = std::log1p(clipped) - std::log1p(std::max(static_cast<double>(t[i]), 1e-7));
    sum += e * e;
    if (g != nullptr) {
      g[i] = static_cast<float>(p[i] >= 1e-7 ? scale * 2.0 * e * inverse / (1.0 + clipped) : 0.0);
    }
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
