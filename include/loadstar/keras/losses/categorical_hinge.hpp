/// \file
/// `CategoricalHinge`: `maximum(max((1 - y_true) * y_pred) - sum(y_true * y_pred) + 1, 0)` per row,
/// as `keras.losses.CategoricalHinge`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The categorical hinge loss of one-hot (or any) labels, over the last axis.
/// \code
/// losses::CategoricalHinge loss;
/// \endcode
class CategoricalHinge : public detail::RowLoss<CategoricalHinge> {
 public:
  explicit CategoricalHinge(Reduction reduction = Reduction::sum_over_batch_size,
                            std::string name = "categorical_hinge")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "CategoricalHinge"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> CategoricalHinge::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "CategoricalHinge");
  return std::make_unique<CategoricalHinge>(detail::config_reduction(read),
                                            read.get("name", "categorical_hinge"));
}

double CategoricalHinge::row(const float* t, const float* p, std::size_t n, float* g,
                             double scale) const {
  double positive = 0;
  std::size_t top = 0;
  double negative = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    positive += static_cast<double>(t[i]) * p[i];
    const double other = (1.0 - t[i]) * static_cast<double>(p[i]);
    if (other > negative || i == 0) {
      negative = other;
      top = i;
    }
  }
  const double loss = std::max(negative - positive + 1.0, 0.0);
  if (g != nullptr) {
    for (std::size_t i = 0; i < n; ++i) {
      const double d = loss > 0 ? -static_cast<double>(t[i]) + (i == top ? 1.0 - t[i] : 0.0) : 0.0;
      g[i] = static_cast<float>(scale * d);
    }
  }
  return loss;
}

}  // namespace loadstar::keras::losses
#endif
