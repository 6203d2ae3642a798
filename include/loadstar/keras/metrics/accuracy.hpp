/// \file
/// The accuracy metrics of `tf.keras.metrics`: `Accuracy`, `BinaryAccuracy`,
/// `CategoricalAccuracy`, `SparseCategoricalAccuracy`, `TopKCategoricalAccuracy` and
/// `SparseTopKCategoricalAccuracy`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_formulas.hpp"
#include "loadstar/keras/metrics/detail/mean_wrapper.hpp"

namespace loadstar::keras::metrics {

/// How often `y_pred` equals `y_true`, element by element (`tf.keras.metrics.Accuracy`).
/// \code
/// metrics::Accuracy accuracy;
/// accuracy.update_state(y_true, y_pred, nullptr);
/// double value = accuracy.result();
/// \endcode
class Accuracy : public detail::MeanWrapper<Accuracy> {
 public:
  explicit Accuracy(std::string name = "accuracy") : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "Accuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  static constexpr bool elementwise = true;
  double value(const float* t, const float* p, std::size_t) const {
    return detail::accuracy_value(t, p);
  }
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::accuracy, 0.5};
  }
};

/// How often `y_pred > threshold` matches the 0/1 label, averaged over the last axis.
/// \code
/// metrics::BinaryAccuracy accuracy("accuracy", 0.5);
/// \endcode
class BinaryAccuracy : public detail::MeanWrapper<BinaryAccuracy> {
 public:
  explicit BinaryAccuracy(std::string name = "binary_accuracy", double threshold = 0.5)
      : MeanWrapper(std::move(name)), threshold_(threshold) {}
  std::string class_name() const override { return "BinaryAccuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL double value(const float* t, const float* p, std::size_t n) const;
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::binary_accuracy, threshold_};
  }

 private:
  double threshold_;
};

/// How often the argmax of `y_pred` is the argmax of the one-hot `y_true`.
/// \code
/// metrics::CategoricalAccuracy accuracy;
/// \endcode
class CategoricalAccuracy : public detail::MeanWrapper<CategoricalAccuracy> {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy")
      : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "CategoricalAccuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  double value(const float* t, const float* p, std::size_t n) const {
    return detail::categorical_accuracy_value(t, p, n);
  }
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::categorical_accuracy, 0.5};
  }
};

/// How often the argmax of `y_pred` equals the class index in `y_true` (shape `(n,)` or `(n, 1)`).
/// \code
/// metrics::SparseCategoricalAccuracy accuracy("accuracy");
/// \endcode
class SparseCategoricalAccuracy : public detail::MeanWrapper<SparseCategoricalAccuracy> {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
      : MeanWrapper(std::move(name)) {}
  std::string class_name() const override { return "SparseCategoricalAccuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  std::size_t true_size(std::size_t) const noexcept { return 1; }
  void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const {
    check_sparse_shapes(y_true, y_pred);
  }
  double value(const float* t, const float* p, std::size_t n) const {
    return detail::sparse_categorical_accuracy_value(t, p, n);
  }
  std::optional<MeanMetricSpec> device_spec() const {
    return MeanMetricSpec{MeanMetricKind::sparse_categorical_accuracy, 0.5};
  }
};

/// How often the argmax of the one-hot `y_true` is among the `k` largest predictions.
/// \code
/// metrics::TopKCategoricalAccuracy top5;  // k = 5
/// \endcode
class TopKCategoricalAccuracy : public detail::MeanWrapper<TopKCategoricalAccuracy> {
 public:
  explicit TopKCategoricalAccuracy(std::size_t k = 5,
                                   std::string name = "top_k_categorical_accuracy")
      : MeanWrapper(std::move(name)), k_(k) {}
  std::string class_name() const override { return "TopKCategoricalAccuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  double value(const float* t, const float* p, std::size_t n) const {
    return detail::in_top_k(p, n, detail::argmax(t, n), k_) ? 1.0 : 0.0;
  }

 private:
  std::size_t k_;
};

/// How often the class index in `y_true` is among the `k` largest predictions; an index outside
/// `[0, classes)` is a `ConfigError`.
/// \code
/// metrics::SparseTopKCategoricalAccuracy top3(3);
/// \endcode
class SparseTopKCategoricalAccuracy : public detail::MeanWrapper<SparseTopKCategoricalAccuracy> {
 public:
  explicit SparseTopKCategoricalAccuracy(std::size_t k = 5,
                                         std::string name = "sparse_top_k_categorical_accuracy")
      : MeanWrapper(std::move(name)), k_(k) {}
  std::string class_name() const override { return "SparseTopKCategoricalAccuracy"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  std::size_t true_size(std::size_t) const noexcept { return 1; }
  LOADSTAR_DECL void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const;
  double value(const float* t, const float* p, std::size_t n) const {
    return detail::in_top_k(p, n, static_cast<std::size_t>(*t), k_) ? 1.0 : 0.0;
  }

 private:
  std::size_t k_;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> Accuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "Accuracy");
  return std::make_unique<Accuracy>(read.get("name", "accuracy"));
}

std::unique_ptr<Metric> BinaryAccuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "BinaryAccuracy");
  return std::make_unique<BinaryAccuracy>(read.get("name", "binary_accuracy"),
                                          read.get("threshold", 0.5));
}

nlohmann::json BinaryAccuracy::get_config() const {
  auto config = Metric::get_config();
  config["threshold"] = threshold_;
  return config;
}

double BinaryAccuracy::value(const float* t, const float* p, std::size_t n) const {
  return detail::binary_accuracy_value(t, p, n, threshold_);
}

std::unique_ptr<Metric> CategoricalAccuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "CategoricalAccuracy");
  return std::make_unique<CategoricalAccuracy>(read.get("name", "categorical_accuracy"));
}

std::unique_ptr<Metric> SparseCategoricalAccuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "SparseCategoricalAccuracy");
  return std::make_unique<SparseCategoricalAccuracy>(
      read.get("name", "sparse_categorical_accuracy"));
}

std::unique_ptr<Metric> TopKCategoricalAccuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "TopKCategoricalAccuracy");
  return std::make_unique<TopKCategoricalAccuracy>(read.get("k", std::size_t{5}),
                                                   read.get("name", "top_k_categorical_accuracy"));
}

nlohmann::json TopKCategoricalAccuracy::get_config() const {
  auto config = Metric::get_config();
  config["k"] = k_;
  return config;
}

std::unique_ptr<Metric> SparseTopKCategoricalAccuracy::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "SparseTopKCategoricalAccuracy");
  return std::make_unique<SparseTopKCategoricalAccuracy>(
      read.get("k", std::size_t{5}), read.get("name", "sparse_top_k_categorical_accuracy"));
}

nlohmann::json SparseTopKCategoricalAccuracy::get_config() const {
  auto config = Metric::get_config();
  config["k"] = k_;
  return config;
}

void SparseTopKCategoricalAccuracy::check_shapes(const Tensor<float>& y_true,
                                                 const Tensor<float>& y_pred) const {
  check_sparse_shapes(y_true, y_pred);
  const std::size_t classes = detail::last_axis(y_pred);
  for (std::size_t i = 0; i < y_true.size(); ++i) {
    const double v = y_true.data()[i];
    if (!(v >= 0 && v < static_cast<double>(classes))) {
      throw ConfigError(name() + ": label " + detail::format_value(v) + " at row " +
                        std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
    }
  }
}

}  // namespace loadstar::keras::metrics
#endif
