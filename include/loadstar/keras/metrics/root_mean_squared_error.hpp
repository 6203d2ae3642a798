/// \file
/// `RootMeanSquaredError`: the square root of the running mean squared error, as
/// `keras.metrics.RootMeanSquaredError`.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "loadstar/keras/metrics/detail/mean_wrapper.hpp"

namespace loadstar::keras::metrics {

/// `sqrt` of the running weighted mean of `mean(square(y_true - y_pred), axis=-1)` (Keras's
/// `Mean` of the squared errors, each row weighted by its sample weight). On a device backend the
/// batch sums are computed there, as `MeanSquaredError`'s.
/// \code
/// metrics::RootMeanSquaredError rmse;
/// \endcode
class RootMeanSquaredError : public detail::MeanWrapper<RootMeanSquaredError> {
 public:
  explicit RootMeanSquaredError(std::string name = "root_mean_squared_error")
      : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "RootMeanSquaredError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  double value(const float* t, const float* p, std::size_t n) const {
    return detail::squared_error_mean(t, p, n);
  }
  double result() const override { return std::sqrt(MeanWrapper::result()); }
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::mean_squared_error, 0.5};
  }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> RootMeanSquaredError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "RootMeanSquaredError");
  return std::make_unique<RootMeanSquaredError>(read.get("name", "root_mean_squared_error"));
}

}  // namespace loadstar::keras::metrics
#endif
