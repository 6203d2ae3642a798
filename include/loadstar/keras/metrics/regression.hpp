/// \file
/// The regression metrics of `tf.keras.metrics`: `MeanSquaredError` and `MeanAbsoluteError`.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "loadstar/keras/metrics/detail/mean_wrapper.hpp"

namespace loadstar::keras::metrics {

/// The running weighted mean of `mean(square(y_true - y_pred), axis=-1)`.
/// \code
/// metrics::MeanSquaredError mse("mse");
/// \endcode
class MeanSquaredError : public detail::MeanWrapper<MeanSquaredError> {
 public:
  explicit MeanSquaredError(std::string name = "mean_squared_error")
      : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "MeanSquaredError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL double value(const float* t, const float* p, std::size_t n) const;
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::mean_squared_error, 0.5};
  }
};

/// The running weighted mean of `mean(abs(y_true - y_pred), axis=-1)`.
/// \code
/// metrics::MeanAbsoluteError mae("mae");
/// \endcode
class MeanAbsoluteError : public detail::MeanWrapper<MeanAbsoluteError> {
 public:
  explicit MeanAbsoluteError(std::string name = "mean_absolute_error")
      : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "MeanAbsoluteError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL double value(const float* t, const float* p, std::size_t n) const;
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::mean_absolute_error, 0.5};
  }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> MeanSquaredError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "MeanSquaredError");
  return std::make_unique<MeanSquaredError>(read.get("name", "mean_squared_error"));
}

double MeanSquaredError::value(const float* t, const float* p, std::size_t n) const {
  return detail::squared_error_mean(t, p, n);
}

std::unique_ptr<Metric> MeanAbsoluteError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "MeanAbsoluteError");
  return std::make_unique<MeanAbsoluteError>(read.get("name", "mean_absolute_error"));
}

double MeanAbsoluteError::value(const float* t, const float* p, std::size_t n) const {
  return detail::absolute_error_mean(t, p, n);
}

}  // namespace loadstar::keras::metrics
#endif
