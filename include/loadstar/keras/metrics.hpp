/// \file
/// The metrics, and `get_metric`, which resolves Keras's metric strings as `Model.compile` does.
#pragma once

#include "loadstar/config.hpp"

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/metrics/accuracy.hpp"
#include "loadstar/keras/metrics/auc.hpp"
#include "loadstar/keras/metrics/f_beta_score.hpp"
#include "loadstar/keras/metrics/hinge.hpp"
#include "loadstar/keras/metrics/iou.hpp"
#include "loadstar/keras/metrics/mean.hpp"
#include "loadstar/keras/metrics/metric.hpp"
#include "loadstar/keras/metrics/precision.hpp"
#include "loadstar/keras/metrics/probabilistic.hpp"
#include "loadstar/keras/metrics/r2_score.hpp"
#include "loadstar/keras/metrics/recall.hpp"
#include "loadstar/keras/metrics/regression.hpp"
#include "loadstar/keras/metrics/regression_errors.hpp"
#include "loadstar/keras/metrics/root_mean_squared_error.hpp"
#include "loadstar/keras/metrics/sensitivity_specificity.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras {

/// The metric registry: Keras's metric function names (`"accuracy"`, `"binary_accuracy"`,
/// `"mse"`, ...), made with the name they were given, and class names (`"BinaryAccuracy"`,
/// `"AUC"`, ...), made from their configs. `"MeanMetricWrapper"` (what tf.keras writes for
/// compiled string metrics: `{"name": "accuracy", "fn": "categorical_accuracy"}`) makes the metric
/// of its `fn` under its `name`.
template <>
struct RegistryTraits<Metric> {
  using Object = std::unique_ptr<Metric>;
  static constexpr const char* kind = "metric";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Metric>& registry);
};

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
LOADSTAR_DECL std::unique_ptr<Metric> get_metric(std::string_view name,
                                                 std::string_view loss_class_name,
                                                 const Shape& y_true_shape,
                                                 const Shape& y_pred_shape);

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<loadstar::keras::Metric>::defaults(Registry<Metric>& registry) {
  using namespace metrics;
  using Factory = Registry<Metric>::Factory;
  // A function name logs under itself unless the config names the metric (Keras's
  // `MeanMetricWrapper(fn, name=metric_name)` in compile_utils).
  const auto function = [&](const char* name, Factory factory) {
    registry.add(name, [name = std::string(name), factory](const nlohmann::json& config) {
      auto metric = factory(config);
      if (!config.contains("name")) metric->set_name(name);
      return metric;
    });
  };
  function("accuracy", Accuracy::from_config);
  function("binary_accuracy", BinaryAccuracy::from_config);
  function("categorical_accuracy", CategoricalAccuracy::from_config);
  function("sparse_categorical_accuracy", SparseCategoricalAccuracy::from_config);
  function("top_k_categorical_accuracy", TopKCategoricalAccuracy::from_config);
  function("sparse_top_k_categorical_accuracy", SparseTopKCategoricalAccuracy::from_config);
  function("mse", metrics::MeanSquaredError::from_config);
  function("mean_squared_error", metrics::MeanSquaredError::from_config);
  function("mae", metrics::MeanAbsoluteError::from_config);
  function("mean_absolute_error", metrics::MeanAbsoluteError::from_config);
  function("precision", Precision::from_config);
  function("recall", Recall::from_config);
  function("auc", AUC::from_config);
  registry.add("Accuracy", Accuracy::from_config);
  registry.add("BinaryAccuracy", BinaryAccuracy::from_config);
  registry.add("CategoricalAccuracy", CategoricalAccuracy::from_config);
  registry.add("SparseCategoricalAccuracy", SparseCategoricalAccuracy::from_config);
  registry.add("TopKCategoricalAccuracy", TopKCategoricalAccuracy::from_config);
  registry.add("SparseTopKCategoricalAccuracy", SparseTopKCategoricalAccuracy::from_config);
  registry.add("MeanSquaredError", metrics::MeanSquaredError::from_config);
  registry.add("MeanAbsoluteError", metrics::MeanAbsoluteError::from_config);
  registry.add("Precision", Precision::from_config);
  registry.add("Recall", Recall::from_config);
  registry.add("AUC", AUC::from_config);
  registry.add("Mean", Mean::from_config);
  // Keras 3's further metrics by class name and by the function or snake-case names that have
  // defaults for every argument (tf.keras's compile strings and Keras 3's `metrics.get`).
  const auto both = [&](std::initializer_list<const char*> functions, const char* class_name,
                        Factory factory) {
    for (const char* name : functions)
      function(name, factory);
    registry.add(class_name, factory);
  };
  both({"root_mean_squared_error"}, "RootMeanSquaredError", RootMeanSquaredError::from_config);
  both({"r2_score"}, "R2Score", R2Score::from_config);
  both({"binary_crossentropy", "bce", "BCE"}, "BinaryCrossentropy",
       metrics::BinaryCrossentropy::from_config);
  both({"categorical_crossentropy"}, "CategoricalCrossentropy",
       metrics::CategoricalCrossentropy::from_config);
  both({"sparse_categorical_crossentropy"}, "SparseCategoricalCrossentropy",
       metrics::SparseCategoricalCrossentropy::from_config);
  both({"kl_divergence", "kld", "KLD", "kullback_leibler_divergence"}, "KLDivergence",
       metrics::KLDivergence::from_config);
  both({"poisson"}, "Poisson", metrics::Poisson::from_config);
  both({"hinge"}, "Hinge", metrics::Hinge::from_config);
  both({"squared_hinge"}, "SquaredHinge", metrics::SquaredHinge::from_config);
  both({"categorical_hinge"}, "CategoricalHinge", metrics::CategoricalHinge::from_config);
  both({"logcosh", "log_cosh", "log_cosh_error"}, "LogCoshError", LogCoshError::from_config);
  both({"mape", "MAPE", "mean_absolute_percentage_error"}, "MeanAbsolutePercentageError",
       metrics::MeanAbsolutePercentageError::from_config);
  both({"msle", "MSLE", "mean_squared_logarithmic_error"}, "MeanSquaredLogarithmicError",
       metrics::MeanSquaredLogarithmicError::from_config);
  both({"cosine_similarity"}, "CosineSimilarity", metrics::CosineSimilarity::from_config);
  both({"f1_score"}, "F1Score", F1Score::from_config);
  both({"fbeta_score", "f_beta_score"}, "FBetaScore", FBetaScore::from_config);
  both({"binary_io_u"}, "BinaryIoU", BinaryIoU::from_config);
  registry.add("IoU", IoU::from_config);
  registry.add("MeanIoU", MeanIoU::from_config);
  registry.add("OneHotIoU", OneHotIoU::from_config);
  registry.add("OneHotMeanIoU", OneHotMeanIoU::from_config);
  registry.add("PrecisionAtRecall", PrecisionAtRecall::from_config);
  registry.add("RecallAtPrecision", RecallAtPrecision::from_config);
  registry.add("SensitivityAtSpecificity", SensitivityAtSpecificity::from_config);
  registry.add("SpecificityAtSensitivity", SpecificityAtSensitivity::from_config);
  registry.add("MeanMetricWrapper", [](const nlohmann::json& config) {
    const auto read = detail::metric_config(config, "MeanMetricWrapper");
    const auto fn = read.get<std::string>("fn");
    auto metric = read.nested(
        "fn", [&] { return Registry<Metric>::instance().create(fn, nlohmann::json::object()); });
    metric->set_name(read.get("name", fn.c_str()));
    return metric;
  });
}

std::unique_ptr<Metric> get_metric(std::string_view name, std::string_view loss_class_name,
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
  // Every other name resolves through the registry (Keras's `metrics.get`).
  return Registry<Metric>::instance().create(logged, nlohmann::json::object());
}

}  // namespace loadstar::keras
#endif
