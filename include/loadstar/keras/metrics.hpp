/// \file
/// The metrics, and `get_metric`, which resolves Keras's metric strings as `Model.compile` does.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loadstar/error.hpp"
#include "loadstar/keras/metrics/accuracy.hpp"
#include "loadstar/keras/metrics/auc.hpp"
#include "loadstar/keras/metrics/mean.hpp"
#include "loadstar/keras/metrics/metric.hpp"
#include "loadstar/keras/metrics/precision.hpp"
#include "loadstar/keras/metrics/recall.hpp"
#include "loadstar/keras/metrics/regression.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras {

/// The metric `Model.compile(metrics=[name])` makes, logged under `name` as Keras does.
///
/// `"accuracy"` and `"acc"` resolve as `tf.keras`'s `compile_utils.MetricsContainer.
/// _get_metric_object`, from the shapes of one batch: binary accuracy when `y_pred`'s last axis
/// is 1, sparse categorical accuracy when `y_true` has fewer axes than `y_pred` or a last axis of
/// 1 while `y_pred`'s is larger, categorical accuracy otherwise (`loss_class_name` is not
/// consulted: `compile_utils` looks at the shapes only). Other names: `"binary_accuracy"`,
/// `"categorical_accuracy"`, `"sparse_categorical_accuracy"`, `"top_k_categorical_accuracy"`,
/// `"sparse_top_k_categorical_accuracy"` (k = 5), `"mse"`, `"mean_squared_error"`, `"mae"`,
/// `"mean_absolute_error"`, `"precision"`, `"recall"`, `"auc"`, and the Keras class names
/// (`"AUC"`, `"Precision"`, ...). Throws `ConfigError` for any other name.
/// \code
/// auto accuracy = get_metric("accuracy", "SparseCategoricalCrossentropy", Shape{32}, Shape{32,
/// 10}); accuracy->class_name();  // "SparseCategoricalAccuracy"; accuracy->name() is "accuracy"
/// \endcode
inline std::unique_ptr<Metric> get_metric(std::string_view name, std::string_view loss_class_name,
                                          const Shape& y_true_shape, const Shape& y_pred_shape) {
  using namespace metrics;
  static_cast<void>(loss_class_name);
  const std::string logged(name);
  if (name == "accuracy" || name == "acc") {
    const std::size_t true_last =
        y_true_shape.rank() == 0 ? 1 : y_true_shape[y_true_shape.rank() - 1];
    const std::size_t pred_last =
        y_pred_shape.rank() == 0 ? 1 : y_pred_shape[y_pred_shape.rank() - 1];
    const bool is_binary = pred_last == 1;
    const bool is_sparse_categorical =
        y_true_shape.rank() < y_pred_shape.rank() || (true_last == 1 && pred_last > 1);
    if (is_binary) return std::make_unique<BinaryAccuracy>(logged);
    if (is_sparse_categorical) return std::make_unique<SparseCategoricalAccuracy>(logged);
    return std::make_unique<CategoricalAccuracy>(logged);
  }
  if (name == "binary_accuracy" || name == "BinaryAccuracy") {
    return std::make_unique<BinaryAccuracy>("binary_accuracy");
  }
  if (name == "categorical_accuracy" || name == "CategoricalAccuracy") {
    return std::make_unique<CategoricalAccuracy>("categorical_accuracy");
  }
  if (name == "sparse_categorical_accuracy" || name == "SparseCategoricalAccuracy") {
    return std::make_unique<SparseCategoricalAccuracy>("sparse_categorical_accuracy");
  }
  if (name == "top_k_categorical_accuracy" || name == "TopKCategoricalAccuracy") {
    return std::make_unique<TopKCategoricalAccuracy>(5, "top_k_categorical_accuracy");
  }
  if (name == "sparse_top_k_categorical_accuracy" || name == "SparseTopKCategoricalAccuracy") {
    return std::make_unique<SparseTopKCategoricalAccuracy>(5, "sparse_top_k_categorical_accuracy");
  }
  if (name == "mse" || name == "mean_squared_error") {
    return std::make_unique<metrics::MeanSquaredError>(logged);
  }
  if (name == "MeanSquaredError") return std::make_unique<metrics::MeanSquaredError>();
  if (name == "mae" || name == "mean_absolute_error") {
    return std::make_unique<metrics::MeanAbsoluteError>(logged);
  }
  if (name == "MeanAbsoluteError") return std::make_unique<metrics::MeanAbsoluteError>();
  if (name == "precision" || name == "Precision") return std::make_unique<Precision>();
  if (name == "recall" || name == "Recall") return std::make_unique<Recall>();
  if (name == "auc" || name == "AUC") return std::make_unique<AUC>();
  throw ConfigError("unknown metric '" + logged +
                    "'; known: accuracy, acc, binary_accuracy, categorical_accuracy, "
                    "sparse_categorical_accuracy, top_k_categorical_accuracy, "
                    "sparse_top_k_categorical_accuracy, mse, mean_squared_error, mae, "
                    "mean_absolute_error, precision, recall, auc (or their Keras class names)");
}

}  // namespace loadstar::keras
