/// \file
/// `MeanAbsolutePercentageError`: `100 * mean(abs(y_true - y_pred) / maximum(abs(y_true), epsilon),
/// axis=-1)`, as `keras.losses.MeanAbsolutePercentageError`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The mean absolute percentage error, with Keras's epsilon of 1e-7.
/// \code
/// losses::MeanAbsolutePercentageError loss;
/// \endcode
class MeanAbsolutePercentageError : public detail::RowLoss<MeanAbsolutePercentageError> {
 public:
  explicit MeanAbsolutePercentageError(Reduction reduction = Reduction::sum_over_batch_size,
                                       std::string name = "mean_absolute_percentage_error")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "MeanAbsolutePercentageError"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> MeanAbsolutePercentageError::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "MeanAbsolutePercentageError");
  return std::make_unique<MeanAbsolutePercentageError>(
      detail::config_reduction(read), read.get("name", "mean_absolute_percentage_error"));
}

double MeanAbsolutePercentageError::row(const float* t, const float* p, std::size_t n, float* g,
                                        double scale) const {
  double sum = 0;
  const double inverse = 100.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double denominator = std::max(std::abs(static_cast<double>(t[i])), 1e-7);
    const double e = static_cast<double>(p[i]) - t[i];
    sum += std::abs(e) / denominator;
    if (g != nullptr) {
      g[i] = static_cast<float>(scale * inverse * (e > 0 ? 1.0 : e < 0 ? -1.0 : 0.0) / denominator);
    }
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
