/// \file
/// The regression metrics of `tf.keras.metrics`: `MeanSquaredError` and `MeanAbsoluteError`.
#pragma once

#include <cmath>
#include <cstddef>
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
  double value(const float* t, const float* p, std::size_t n) const {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(p[i]) - t[i];
      sum += e * e;
    }
    return sum / static_cast<double>(n);
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
  double value(const float* t, const float* p, std::size_t n) const {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      sum += std::abs(static_cast<double>(p[i]) - t[i]);
    return sum / static_cast<double>(n);
  }
};

}  // namespace loadstar::keras::metrics
