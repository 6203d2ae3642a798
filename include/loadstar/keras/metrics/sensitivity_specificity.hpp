/// \file
/// The metrics of one rate at a constraint on another, as Keras's `SensitivitySpecificityBase`:
/// `SensitivityAtSpecificity`, `SpecificityAtSensitivity`, `PrecisionAtRecall` and
/// `RecallAtPrecision`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/metrics/detail/confusion.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The base of the four metrics: weighted confusion counts at `num_thresholds` thresholds
/// (0, `(i + 1) / (num_thresholds - 1)`, 1; 0.5 alone for one threshold), of column `class_id` of
/// the last axis when given; `result()` is the largest value of one rate among the thresholds
/// where the other is at least `value` (0 when none is). Which rates: `Derived`'s `kind`.
class SensitivitySpecificity : public Metric {
 public:
  /// The rate constrained and the rate maximised.
  enum class Kind {
    sensitivity_at_specificity,
    specificity_at_sensitivity,
    precision_at_recall,
    recall_at_precision
  };

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  /// Throws `ConfigError` for `value` outside [0, 1] or `num_thresholds` 0.
  LOADSTAR_DECL SensitivitySpecificity(Kind kind, double value, std::size_t num_thresholds,
                                       std::optional<std::size_t> class_id, std::string name);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Throws `ShapeError` for shapes that do not match, or a `class_id` beyond the last axis.
  LOADSTAR_DECL void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                  const Tensor<float>* sample_weight) override;
  LOADSTAR_DECL double result() const override;
  void reset_state() override { counts_.reset(); }
  nlohmann::json get_state() const override { return counts_.state(); }
  void set_state(const nlohmann::json& state) override { counts_.restore(name(), state); }

 protected:
  /// The metric of `kind` described by a Keras config, whose constraint is `key`.
  template <class M>
  static std::unique_ptr<Metric> read_config(const nlohmann::json& config, const char* class_name,
                                             const char* key, const char* default_name) {
    const auto read = detail::metric_config(config, class_name);
    return std::make_unique<M>(read.get<double>(key), read.get("num_thresholds", std::size_t{200}),
                               read.optional<std::size_t>("class_id"),
                               read.get("name", default_name));
  }

 private:
  LOADSTAR_DECL static std::vector<double> thresholds(const std::string& owner, std::size_t n);
  LOADSTAR_DECL const char* key() const noexcept;

  Kind kind_;
  double value_;
  std::optional<std::size_t> class_id_;
  detail::ConfusionCounts counts_;
  Tensor<float> column_true_, column_pred_;  // the class_id column of a batch
};

/// The best sensitivity (recall) where the specificity is at least `specificity`.
/// \code
/// metrics::SensitivityAtSpecificity metric(0.5);
/// \endcode
class SensitivityAtSpecificity : public SensitivitySpecificity {
 public:
  explicit SensitivityAtSpecificity(double specificity, std::size_t num_thresholds = 200,
                                    std::optional<std::size_t> class_id = std::nullopt,
                                    std::string name = "sensitivity_at_specificity")
      : SensitivitySpecificity(Kind::sensitivity_at_specificity, specificity, num_thresholds,
                               class_id, std::move(name)) {}
  std::string class_name() const override { return "SensitivityAtSpecificity"; }
  static std::unique_ptr<Metric> from_config(const nlohmann::json& config) {
    return read_config<SensitivityAtSpecificity>(config, "SensitivityAtSpecificity", "specificity",
                                                 "sensitivity_at_specificity");
  }
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<SensitivityAtSpecificity>(*this);
  }
};

/// The best specificity where the sensitivity (recall) is at least `sensitivity`.
/// \code
/// metrics::SpecificityAtSensitivity metric(0.5);
/// \endcode
class SpecificityAtSensitivity : public SensitivitySpecificity {
 public:
  explicit SpecificityAtSensitivity(double sensitivity, std::size_t num_thresholds = 200,
                                    std::optional<std::size_t> class_id = std::nullopt,
                                    std::string name = "specificity_at_sensitivity")
      : SensitivitySpecificity(Kind::specificity_at_sensitivity, sensitivity, num_thresholds,
                               class_id, std::move(name)) {}
  std::string class_name() const override { return "SpecificityAtSensitivity"; }
  static std::unique_ptr<Metric> from_config(const nlohmann::json& config) {
    return read_config<SpecificityAtSensitivity>(config, "SpecificityAtSensitivity", "sensitivity",
                                                 "specificity_at_sensitivity");
  }
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<SpecificityAtSensitivity>(*this);
  }
};

/// The best precision where the recall is at least `recall`.
/// \code
/// metrics::PrecisionAtRecall metric(0.8);
/// \endcode
class PrecisionAtRecall : public SensitivitySpecificity {
 public:
  explicit PrecisionAtRecall(double recall, std::size_t num_thresholds = 200,
                             std::optional<std::size_t> class_id = std::nullopt,
                             std::string name = "precision_at_recall")
      : SensitivitySpecificity(Kind::precision_at_recall, recall, num_thresholds, class_id,
                               std::move(name)) {}
  std::string class_name() const override { return "PrecisionAtRecall"; }
  static std::unique_ptr<Metric> from_config(const nlohmann::json& config) {
    return read_config<PrecisionAtRecall>(config, "PrecisionAtRecall", "recall",
                                          "precision_at_recall");
  }
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<PrecisionAtRecall>(*this);
  }
};

/// The best recall where the precision is at least `precision`.
/// \code
/// metrics::RecallAtPrecision metric(0.8);
/// \endcode
class RecallAtPrecision : public SensitivitySpecificity {
 public:
  explicit RecallAtPrecision(double precision, std::size_t num_thresholds = 200,
                             std::optional<std::size_t> class_id = std::nullopt,
                             std::string name = "recall_at_precision")
      : SensitivitySpecificity(Kind::recall_at_precision, precision, num_thresholds, class_id,
                               std::move(name)) {}
  std::string class_name() const override { return "RecallAtPrecision"; }
  static std::unique_ptr<Metric> from_config(const nlohmann::json& config) {
    return read_config<RecallAtPrecision>(config, "RecallAtPrecision", "precision",
                                          "recall_at_precision");
  }
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<RecallAtPrecision>(*this);
  }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

SensitivitySpecificity::SensitivitySpecificity(Kind kind, double value, std::size_t num_thresholds,
                                               std::optional<std::size_t> class_id,
                                               std::string name)
    : Metric(std::move(name)),
      kind_(kind),
      value_(value),
      class_id_(class_id),
      counts_(thresholds(this->name(), num_thresholds)) {
  if (!(value >= 0 && value <= 1)) {
    throw ConfigError(this->name() + ": " + key() + " must be in [0, 1] but is " +
                      nlohmann::json(value).dump());
  }
}

const char* SensitivitySpecificity::key() const noexcept {
  switch (kind_) {
    case Kind::sensitivity_at_specificity:
      return "specificity";
    case Kind::specificity_at_sensitivity:
      return "sensitivity";
    case Kind::precision_at_recall:
      return "recall";
    case Kind::recall_at_precision:
      return "precision";
  }
  return "";
}

std::vector<double> SensitivitySpecificity::thresholds(const std::string& owner, std::size_t n) {
  if (n == 0) throw ConfigError(owner + ": num_thresholds must be at least 1 but is 0");
  if (n == 1) return {0.5};
  // Keras keeps the thresholds in float32 and compares float32 predictions with them.
  auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  std::vector<double> t{0.0};
  for (std::size_t i = 0; i + 2 < n; ++i)
    t.push_back(as_float(static_cast<double>(i + 1) / static_cast<double>(n - 1)));
  t.push_back(1.0);
  return t;
}

nlohmann::json SensitivitySpecificity::get_config() const {
  auto config = Metric::get_config();
  config["num_thresholds"] = counts_.size();
  config[key()] = value_;
  config["class_id"] = class_id_ ? nlohmann::json(*class_id_) : nlohmann::json(nullptr);
  return config;
}

void SensitivitySpecificity::update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                          const Tensor<float>* sample_weight) {
  if (!class_id_) {
    counts_.update(name(), y_true, y_pred, sample_weight);
    return;
  }
  // Keras's update_confusion_matrix_variables with class_id: y[..., class_id].
  const std::size_t classes = detail::last_axis(y_pred);
  if (y_true.shape() != y_pred.shape() || y_pred.rank() < 2 || *class_id_ >= classes) {
    throw ShapeError(name() + ": class_id " + std::to_string(*class_id_) +
                     " needs y_true and y_pred of one shape with more classes on the last axis " +
                     "but found y_true of shape " + y_true.shape().str() + " and y_pred of shape " +
                     y_pred.shape().str());
  }
  const Shape column = detail::without_last_axis(y_pred.shape());
  if (column_true_.shape() != column) {
    column_true_ = Tensor<float>(column);
    column_pred_ = Tensor<float>(column);
  }
  for (std::size_t j = 0; j < column_true_.size(); ++j) {
    column_true_.data()[j] = y_true.data()[j * classes + *class_id_];
    column_pred_.data()[j] = y_pred.data()[j * classes + *class_id_];
  }
  counts_.update(name(), column_true_, column_pred_, sample_weight);
}

double SensitivitySpecificity::result() const {
  double best = 0;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    const double tp = counts_.true_positives(i), fp = counts_.false_positives(i);
    const double tn = counts_.true_negatives(i), fn = counts_.false_negatives(i);
    const double recall = detail::divide_no_nan(tp, tp + fn);
    const double specificity = detail::divide_no_nan(tn, tn + fp);
    const double precision = detail::divide_no_nan(tp, tp + fp);
    double constrained = 0, dependent = 0;
    switch (kind_) {
      case Kind::sensitivity_at_specificity:
        constrained = specificity, dependent = recall;
        break;
      case Kind::specificity_at_sensitivity:
        constrained = recall, dependent = specificity;
        break;
      case Kind::precision_at_recall:
        constrained = recall, dependent = precision;
        break;
      case Kind::recall_at_precision:
        constrained = precision, dependent = recall;
        break;
    }
    if (constrained >= value_) best = std::max(best, dependent);
  }
  return best;
}

}  // namespace loadstar::keras::metrics
#endif
