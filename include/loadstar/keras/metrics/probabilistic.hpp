/// \file
/// The probabilistic metrics of `keras.metrics`: `BinaryCrossentropy`, `CategoricalCrossentropy`,
/// `SparseCategoricalCrossentropy`, `KLDivergence` and `Poisson`, the running means of the losses
/// of the same names.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/losses/binary_crossentropy.hpp"
#include "loadstar/keras/losses/categorical_crossentropy.hpp"
#include "loadstar/keras/losses/kl_divergence.hpp"
#include "loadstar/keras/losses/poisson.hpp"
#include "loadstar/keras/losses/sparse_categorical_crossentropy.hpp"
#include "loadstar/keras/metrics/detail/loss_metric.hpp"

namespace loadstar::keras::metrics {

/// The running weighted mean of `losses::BinaryCrossentropy` (from probabilities or logits, with
/// label smoothing towards 0.5).
/// \code
/// metrics::BinaryCrossentropy bce(/*from_logits=*/true);
/// \endcode
class BinaryCrossentropy
    : public detail::LossMetric<BinaryCrossentropy, losses::BinaryCrossentropy> {
 public:
  explicit BinaryCrossentropy(bool from_logits = false, double label_smoothing = 0.0,
                              std::string name = "binary_crossentropy")
      : LossMetric(std::move(name)), from_logits_(from_logits), label_smoothing_(label_smoothing) {}
  std::string class_name() const override { return "BinaryCrossentropy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  losses::BinaryCrossentropy make_loss() const {
    return losses::BinaryCrossentropy(from_logits_, label_smoothing_, Reduction::none, name());
  }

 private:
  bool from_logits_;
  double label_smoothing_;
};

/// The running weighted mean of `losses::CategoricalCrossentropy` (one-hot or soft labels over
/// the last axis).
/// \code
/// metrics::CategoricalCrossentropy cce(/*from_logits=*/false, /*label_smoothing=*/0.1);
/// \endcode
class CategoricalCrossentropy
    : public detail::LossMetric<CategoricalCrossentropy, losses::CategoricalCrossentropy> {
 public:
  explicit CategoricalCrossentropy(bool from_logits = false, double label_smoothing = 0.0,
                                   std::string name = "categorical_crossentropy")
      : LossMetric(std::move(name)), from_logits_(from_logits), label_smoothing_(label_smoothing) {}
  std::string class_name() const override { return "CategoricalCrossentropy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory); throws `ConfigError`
  /// for an `axis` other than -1.
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  losses::CategoricalCrossentropy make_loss() const {
    return losses::CategoricalCrossentropy(from_logits_, label_smoothing_, Reduction::none, name());
  }

 private:
  bool from_logits_;
  double label_smoothing_;
};

/// The running weighted mean of `losses::SparseCategoricalCrossentropy` (one class index per row;
/// an index outside the classes is a `ConfigError`).
/// \code
/// metrics::SparseCategoricalCrossentropy scce(/*from_logits=*/true);
/// \endcode
class SparseCategoricalCrossentropy
    : public detail::LossMetric<SparseCategoricalCrossentropy,
                                losses::SparseCategoricalCrossentropy> {
 public:
  explicit SparseCategoricalCrossentropy(bool from_logits = false,
                                         std::string name = "sparse_categorical_crossentropy")
      : LossMetric(std::move(name)), from_logits_(from_logits) {}
  std::string class_name() const override { return "SparseCategoricalCrossentropy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory); throws `ConfigError`
  /// for an `axis` other than -1 or an `ignore_class`.
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  losses::SparseCategoricalCrossentropy make_loss() const {
    return losses::SparseCategoricalCrossentropy(from_logits_, Reduction::none, name());
  }

 private:
  bool from_logits_;
};

/// The running weighted mean of `losses::KLDivergence`.
/// \code
/// metrics::KLDivergence kld;
/// \endcode
class KLDivergence : public detail::LossMetric<KLDivergence, losses::KLDivergence> {
 public:
  explicit KLDivergence(std::string name = "kl_divergence") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "KLDivergence"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::KLDivergence make_loss() const { return losses::KLDivergence(Reduction::none, name()); }
};

/// The running weighted mean of `losses::Poisson`.
/// \code
/// metrics::Poisson poisson;
/// \endcode
class Poisson : public detail::LossMetric<Poisson, losses::Poisson> {
 public:
  explicit Poisson(std::string name = "poisson") : LossMetric(std::move(name)) {}
  std::string class_name() const override { return "Poisson"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  losses::Poisson make_loss() const { return losses::Poisson(Reduction::none, name()); }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> BinaryCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "BinaryCrossentropy");
  read.expect("axis", -1, "loadstar averages over the last axis");
  return std::make_unique<BinaryCrossentropy>(read.get("from_logits", false),
                                              read.get("label_smoothing", 0.0),
                                              read.get("name", "binary_crossentropy"));
}

nlohmann::json BinaryCrossentropy::get_config() const {
  auto config = Metric::get_config();
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  return config;
}

std::unique_ptr<Metric> CategoricalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "CategoricalCrossentropy");
  read.expect("axis", -1, "loadstar sums over the last axis");
  return std::make_unique<CategoricalCrossentropy>(read.get("from_logits", false),
                                                   read.get("label_smoothing", 0.0),
                                                   read.get("name", "categorical_crossentropy"));
}

nlohmann::json CategoricalCrossentropy::get_config() const {
  auto config = Metric::get_config();
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  config["axis"] = -1;
  return config;
}

std::unique_ptr<Metric> SparseCategoricalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "SparseCategoricalCrossentropy");
  read.expect("axis", -1, "loadstar takes the classes on the last axis");
  read.expect("ignore_class", nullptr, "loadstar ignores no class");
  return std::make_unique<SparseCategoricalCrossentropy>(
      read.get("from_logits", false), read.get("name", "sparse_categorical_crossentropy"));
}

nlohmann::json SparseCategoricalCrossentropy::get_config() const {
  auto config = Metric::get_config();
  config["from_logits"] = from_logits_;
  config["ignore_class"] = nullptr;
  config["axis"] = -1;
  return config;
}

std::unique_ptr<Metric> KLDivergence::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "KLDivergence");
  return std::make_unique<KLDivergence>(read.get("name", "kl_divergence"));
}

std::unique_ptr<Metric> Poisson::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "Poisson");
  return std::make_unique<Poisson>(read.get("name", "poisson"));
}

}  // namespace loadstar::keras::metrics
#endif
