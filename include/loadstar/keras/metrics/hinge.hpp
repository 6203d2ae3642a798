/// \file
/// The hinge metrics of `keras.metrics`: `Hinge`, `SquaredHinge` and `CategoricalHinge`, the
/// running means of the losses of the same names.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/losses/categorical_hinge.hpp"
#include "loadstar/keras/losses/hinge.hpp"
#include "loadstar/keras/losses/squared_hinge.hpp"
#include "loadstar/keras/metrics/detail/loss_metric.hpp"

namespace loadstar::keras::metrics {

/// The running weighted mean of `losses::Hinge` (0/1 labels of a batch become -1/1).
/// \code
/// metrics::Hinge metric;
/// \endcode
class Hinge : public detail::LossMetric<Hinge, losses::Hinge> {
 public:
  explicit Hinge(std::string name = "hinge") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "Hinge"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::Hinge make_loss() const { return losses::Hinge(Reduction::none, name()); }
};

/// The running weighted mean of `losses::SquaredHinge`.
/// \code
/// metrics::SquaredHinge metric;
/// \endcode
class SquaredHinge : public detail::LossMetric<SquaredHinge, losses::SquaredHinge> {
 public:
  explicit SquaredHinge(std::string name = "squared_hinge") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "SquaredHinge"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::SquaredHinge make_loss() const { return losses::SquaredHinge(Reduction::none, name()); }
};

/// The running weighted mean of `losses::CategoricalHinge`.
/// \code
/// metrics::CategoricalHinge metric;
/// \endcode
class CategoricalHinge : public detail::LossMetric<CategoricalHinge, losses::CategoricalHinge> {
 public:
  explicit CategoricalHinge(std::string name = "categorical_hinge") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "CategoricalHinge"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::CategoricalHinge make_loss() const {
    return losses::CategoricalHinge(Reduction::none, name());
  }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> Hinge::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "Hinge");
  return std::make_unique<Hinge>(read.get("name", "hinge"));
}

std::unique_ptr<Metric> SquaredHinge::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "SquaredHinge");
  return std::make_unique<SquaredHinge>(read.get("name", "squared_hinge"));
}

std::unique_ptr<Metric> CategoricalHinge::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "CategoricalHinge");
  return std::make_unique<CategoricalHinge>(read.get("name", "categorical_hinge"));
}

}  // namespace loadstar::keras::metrics
#endif
