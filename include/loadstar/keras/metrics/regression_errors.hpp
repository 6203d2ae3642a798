/// \file
/// The further regression metrics of `keras.metrics`: `LogCoshError`,
/// `MeanAbsolutePercentageError`, `MeanSquaredLogarithmicError` and `CosineSimilarity`, the
/// running means of the losses of the same names.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/losses/cosine_similarity.hpp"
#include "loadstar/keras/losses/log_cosh.hpp"
#include "loadstar/keras/losses/mean_absolute_percentage_error.hpp"
#include "loadstar/keras/losses/mean_squared_logarithmic_error.hpp"
#include "loadstar/keras/metrics/detail/loss_metric.hpp"

namespace loadstar::keras::metrics {

/// The running weighted mean of `losses::LogCosh` (Keras logs it as `logcosh`).
/// \code
/// metrics::LogCoshError metric;
/// \endcode
class LogCoshError : public detail::LossMetric<LogCoshError, losses::LogCosh> {
 public:
  explicit LogCoshError(std::string name = "logcosh") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "LogCoshError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::LogCosh make_loss() const { return losses::LogCosh(Reduction::none, name()); }
};

/// The running weighted mean of `losses::MeanAbsolutePercentageError`.
/// \code
/// metrics::MeanAbsolutePercentageError metric;
/// \endcode
class MeanAbsolutePercentageError
    : public detail::LossMetric<MeanAbsolutePercentageError, losses::MeanAbsolutePercentageError> {
 public:
  explicit MeanAbsolutePercentageError(std::string name = "mean_absolute_percentage_error")
      : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "MeanAbsolutePercentageError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::MeanAbsolutePercentageError make_loss() const {
    return losses::MeanAbsolutePercentageError(Reduction::none, name());
  }
};

/// The running weighted mean of `losses::MeanSquaredLogarithmicError`.
/// \code
/// metrics::MeanSquaredLogarithmicError metric;
/// \endcode
class MeanSquaredLogarithmicError
    : public detail::LossMetric<MeanSquaredLogarithmicError, losses::MeanSquaredLogarithmicError> {
 public:
  explicit MeanSquaredLogarithmicError(std::string name = "mean_squared_logarithmic_error")
      : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "MeanSquaredLogarithmicError"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::MeanSquaredLogarithmicError make_loss() const {
    return losses::MeanSquaredLogarithmicError(Reduction::none, name());
  }
};

/// The running weighted mean of the cosine similarity of each last-axis row of `y_true` and
/// `y_pred` (1 where they point the same way): `losses::CosineSimilarity` negated.
/// \code
/// metrics::CosineSimilarity cosine;
/// \endcode
class CosineSimilarity : public detail::LossMetric<CosineSimilarity, losses::CosineSimilarity> {
 public:
  explicit CosineSimilarity(std::string name = "cosine_similarity") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "CosineSimilarity"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory); throws `ConfigError`
  /// for an `axis` other than -1.
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  static constexpr double sign = -1.0;
  losses::CosineSimilarity make_loss() const {
    return losses::CosineSimilarity(Reduction::none, name());
  }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> LogCoshError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "LogCoshError");
  return std::make_unique<LogCoshError>(read.get("name", "logcosh"));
}

std::unique_ptr<Metric> MeanAbsolutePercentageError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "MeanAbsolutePercentageError");
  return std::make_unique<MeanAbsolutePercentageError>(
      read.get("name", "mean_absolute_percentage_error"));
}

std::unique_ptr<Metric> MeanSquaredLogarithmicError::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "MeanSquaredLogarithmicError");
  return std::make_unique<MeanSquaredLogarithmicError>(
      read.get("name", "mean_squared_logarithmic_error"));
}

std::unique_ptr<Metric> CosineSimilarity::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "CosineSimilarity");
  read.expect("axis", -1, "the similarity is computed over the last axis");
  return std::make_unique<CosineSimilarity>(read.get("name", "cosine_similarity"));
}

nlohmann::json CosineSimilarity::get_config() const {
  auto config = Metric::get_config();
  config["axis"] = -1;
  return config;
}

}  // namespace loadstar::keras::metrics
#endif
