/// \file
/// `Hinge`: `mean(maximum(1 - y_true * y_pred, 0), axis=-1)`, as `tf.keras.losses.Hinge`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The hinge loss; labels that are all 0 or 1 become -1 and 1 first (Keras's
/// `_maybe_convert_labels`), labels already in {-1, 1} are used as they are.
/// \code
/// losses::Hinge hinge;
/// \endcode
class Hinge : public detail::RowLoss<Hinge> {
 public:
  explicit Hinge(Reduction reduction = Reduction::sum_over_batch_size, std::string name = "hinge")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "Hinge"; }

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

std::unique_ptr<Loss> Hinge::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "Hinge");
  return std::make_unique<Hinge>(detail::config_reduction(read), read.get("name", "hinge"));
}

void Hinge::prepare(const Tensor<float>& y_true) {
  convert_ = std::all_of(y_true.begin(), y_true.end(), [](float y) { return y == 0 || y == 1; });
}

double Hinge::row(const float* t, const float* p, std::size_t n, float* g, double scale) const {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double y = convert_ ? 2.0 * t[i] - 1.0 : static_cast<double>(t[i]);
    const double margin = 1.0 - y * p[i];
    sum += std::max(margin, 0.0);
    if (g != nullptr) g[i] = static_cast<float>(margin > 0 ? -scale * y * inverse : 0.0);
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
