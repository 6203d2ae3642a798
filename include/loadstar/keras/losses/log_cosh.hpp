/// \file
/// `LogCosh`: `mean(log(cosh(y_pred - y_true)), axis=-1)`, as `keras.losses.LogCosh`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The logarithm of the hyperbolic cosine of the error, computed as Keras does: `x + softplus(-2x)
/// - log(2)`. \code losses::LogCosh loss; \endcode
class LogCosh : public detail::RowLoss<LogCosh> {
 public:
  explicit LogCosh(Reduction reduction = Reduction::sum_over_batch_size,
                   std::string name = "log_cosh")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "LogCosh"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> LogCosh::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "LogCosh");
  return std::make_unique<LogCosh>(detail::config_reduction(read), read.get("name", "log_cosh"));
}

double LogCosh::row(const float* t, const float* p, std::size_t n, float* g, double scale) const {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(p[i]) - t[i];
    const double softplus = std::log1p(std::exp(-std::abs(2.0 * x))) + std::max(-2.0 * x, 0.0);
    sum += x + softplus - std::log(2.0);
    if (g != nullptr) g[i] = static_cast<float>(scale * std::tanh(x) * inverse);
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
