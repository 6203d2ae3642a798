/// \file
/// `SquaredHinge`: `mean(maximum(1 - y_true * y_pred, 0)^2, axis=-1)`, as
/// `keras.losses.SquaredHinge`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The squared hinge loss; labels that are all 0 or 1 become -1 and 1 first, as for `Hinge`.
/// \code
/// losses::SquaredHinge loss;
/// \endcode
class SquaredHinge : public detail::RowLoss<SquaredHinge> {
 public:
  explicit SquaredHinge(Reduction reduction = Reduction::sum_over_batch_size,
                        std::string name = "squared_hinge")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "SquaredHinge"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL void prepare(const Tensor<float>& y_true);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

 private:
  bool convert_ = false;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> SquaredHinge::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "SquaredHinge");
  return std::make_unique<SquaredHinge>(detail::config_reduction(read),
                                        read.get("name", "squared_hinge"));
}

void SquaredHinge::prepare(const Tensor<float>& y_true) {
  convert_ = std::all_of(y_true.begin(), y_true.end(), [](float y) { return y == 0 || y == 1; });
}

double SquaredHinge::row(const float* t, const float* p, std::size_t n, float* g,
                         double scale) const {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double y = convert_ ? 2.0 * t[i] - 1.0 : static_cast<double>(t[i]);
    const double margin = std::max(1.0 - y * p[i], 0.0);
    sum += margin * margin;
    if (g != nullptr) g[i] = static_cast<float>(-2.0 * scale * margin * y * inverse);
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
