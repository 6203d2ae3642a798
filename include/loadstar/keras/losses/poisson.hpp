/// \file
/// `Poisson`: `mean(y_pred - y_true * log(y_pred + epsilon), axis=-1)`, as `keras.losses.Poisson`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The Poisson loss, with Keras's epsilon of 1e-7.
/// \code
/// losses::Poisson loss;
/// \endcode
class Poisson : public detail::RowLoss<Poisson> {
 public:
  explicit Poisson(Reduction reduction = Reduction::sum_over_batch_size,
                   std::string name = "poisson")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "Poisson"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> Poisson::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "Poisson");
  return std::make_unique<Poisson>(detail::config_reduction(read), read.get("name", "poisson"));
}

double Poisson::row(const float* t, const float* p, std::size_t n, float* g, double scale) const {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double shifted = static_cast<double>(p[i]) + 1e-7;
    sum += p[i] - t[i] * std::log(shifted);
    if (g != nullptr) g[i] = static_cast<float>(scale * (1.0 - t[i] / shifted) * inverse);
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
