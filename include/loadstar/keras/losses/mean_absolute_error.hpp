/// \file
/// `MeanAbsoluteError`: `mean(abs(y_true - y_pred), axis=-1)`, as `tf.keras.losses`.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The mean of the absolute errors over the last axis, then Keras's reduction (the derivative of
/// `abs` at 0 is 0, as TensorFlow's).
/// \code
/// losses::MeanAbsoluteError mae;
/// float loss = mae.compute(y_true, y_pred, nullptr, Tensor<float>());  // no gradient
/// \endcode
class MeanAbsoluteError : public detail::RowLoss<MeanAbsoluteError> {
 public:
  explicit MeanAbsoluteError(Reduction reduction = Reduction::sum_over_batch_size,
                             std::string name = "mean_absolute_error")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "MeanAbsoluteError"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::mean_absolute_error;
    return spec;
  }
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> MeanAbsoluteError::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "MeanAbsoluteError");
  return std::make_unique<MeanAbsoluteError>(detail::config_reduction(read),
                                             read.get("name", "mean_absolute_error"));
}

double MeanAbsoluteError::row(const float* t, const float* p, std::size_t n, float* g,
                              double scale) const {
  return detail::absolute_error_row(t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
