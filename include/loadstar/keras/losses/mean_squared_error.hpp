/// \file
/// `MeanSquaredError`: `mean(square(y_true - y_pred), axis=-1)`, as `tf.keras.losses`.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <optional>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The mean of the squared errors over the last axis, then Keras's reduction.
/// \code
/// losses::MeanSquaredError mse;
/// float loss = mse.compute(y_true, y_pred, nullptr, gradient);  // gradient: y_pred's shape
/// \endcode
class MeanSquaredError : public detail::RowLoss<MeanSquaredError> {
 public:
  explicit MeanSquaredError(Reduction reduction = Reduction::sum_over_batch_size,
                            std::string name = "mean_squared_error")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "MeanSquaredError"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::mean_squared_error;
    return spec;
  }
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> MeanSquaredError::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "MeanSquaredError");
  return std::make_unique<MeanSquaredError>(detail::config_reduction(read),
                                            read.get("name", "mean_squared_error"));
}

double MeanSquaredError::row(const float* t, const float* p, std::size_t n, float* g,
                             double scale) const {
  return detail::squared_error_row(t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
