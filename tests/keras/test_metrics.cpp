#include <doctest/doctest.h>

#include "reference_values.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/keras/metrics.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::keras::get_metric;

using reference_values::check_close;
using reference_values::reference;
using reference_values::tensor_of;

TEST_SUITE("keras") {
  TEST_CASE("Metric running results over two batches match the PyTorch reference") {
    // Float64 accumulation of float32 inputs: 1e-6 absolute plus 1e-6 relative.
    for (const auto& c : reference()["metrics"]) {
      const std::string kind = c["metric"];
      CAPTURE(kind);
      const auto& first = c["batches"][0];
      // "accuracy" in the reference is tf.keras.metrics.Accuracy (element-wise equality), not
      // what compile resolves the string to.
      std::unique_ptr<loadstar::keras::Metric> metric;
      if (kind == "accuracy") {
        metric = std::make_unique<loadstar::keras::metrics::Accuracy>();
      } else {
        metric = get_metric(kind, "", Shape(first["y_true_shape"].get<std::vector<std::size_t>>()),
                            Shape(first["y_pred_shape"].get<std::vector<std::size_t>>()));
      }
      CHECK(metric->name() == kind);
      for (int pass = 0; pass < 2; ++pass) {  // the second pass checks reset_state
        std::vector<float> results;
        for (const auto& b : c["batches"]) {
          const Tensor<float> y_true = tensor_of(b["y_true"], b["y_true_shape"]);
          const Tensor<float> y_pred = tensor_of(b["y_pred"], b["y_pred_shape"]);
          Tensor<float> weights;
          const bool weighted = !b["sample_weight"].is_null();
          if (weighted) {
            weights = tensor_of(b["sample_weight"], nlohmann::json::array({y_pred.rows()}));
          }
          metric->update_state(y_true, y_pred, weighted ? &weights : nullptr);
          results.push_back(static_cast<float>(metric->result()));
        }
        check_close(kind, results, c["results"].get<std::vector<double>>(), 1e-6, 1e-6);
        metric->reset_state();
        CHECK(metric->result() == 0.0);
      }
    }
  }

  TEST_CASE("Mean averages values with their weights") {
    loadstar::keras::metrics::Mean mean("loss");
    mean.update_state(0.7, 32);
    mean.update_state(0.5, 16);
    CHECK(mean.result() == doctest::Approx((0.7 * 32 + 0.5 * 16) / 48));
    Tensor<float> values({2}, {1, 3}), weights({2}, {1, 3});
    mean.reset_state();
    mean.update_state(Tensor<float>(), values, &weights);
    CHECK(mean.result() == doctest::Approx(2.5));
  }

  TEST_CASE("Metric rejects mismatched shapes and labels outside the classes") {
    auto accuracy = get_metric("accuracy", "", Shape{4, 3}, Shape{4, 3});
    CHECK_THROWS_WITH_AS(
        accuracy->update_state(Tensor<float>({4, 3}), Tensor<float>({4, 2}), nullptr),
        doctest::Contains("accuracy: y_true of shape (4, 3) does not match y_pred of shape (4, 2)"),
        ShapeError);
    auto sparse = get_metric("accuracy", "", Shape{4}, Shape{4, 3});
    CHECK_THROWS_WITH_AS(
        sparse->update_state(Tensor<float>({5}), Tensor<float>({4, 3}), nullptr),
        doctest::Contains("accuracy: y_true of shape (5,) does not match y_pred of shape (4, 3)"),
        ShapeError);
    auto top_k = get_metric("sparse_top_k_categorical_accuracy", "", Shape{2}, Shape{2, 10});
    CHECK_THROWS_WITH_AS(
        top_k->update_state(Tensor<float>({2}, {1, 12}), Tensor<float>({2, 10}), nullptr),
        doctest::Contains(
            "sparse_top_k_categorical_accuracy: label 12 at row 1 is outside [0, 10)"),
        ConfigError);
    auto auc = get_metric("auc", "", Shape{4, 1}, Shape{4, 1});
    Tensor<float> weights({3});
    CHECK_THROWS_WITH_AS(
        auc->update_state(Tensor<float>({4, 1}), Tensor<float>({4, 1}), &weights),
        doctest::Contains("auc: sample_weight of shape (3,) needs one weight per row"), ShapeError);
  }

  TEST_CASE("get_metric resolves accuracy from the shapes as compile_utils does") {
    auto sparse = get_metric("accuracy", "SparseCategoricalCrossentropy", Shape{32}, Shape{32, 10});
    CHECK(sparse->class_name() == "SparseCategoricalAccuracy");
    CHECK(sparse->name() == "accuracy");
    CHECK(get_metric("acc", "", Shape{32, 1}, Shape{32, 10})->class_name() ==
          "SparseCategoricalAccuracy");
    CHECK(get_metric("acc", "", Shape{32, 1}, Shape{32, 10})->name() == "acc");
    CHECK(get_metric("accuracy", "BinaryCrossentropy", Shape{32, 1}, Shape{32, 1})->class_name() ==
          "BinaryAccuracy");
    CHECK(get_metric("accuracy", "", Shape{32}, Shape{32, 1})->class_name() == "BinaryAccuracy");
    CHECK(get_metric("accuracy", "CategoricalCrossentropy", Shape{32, 10}, Shape{32, 10})
              ->class_name() == "CategoricalAccuracy");
    CHECK(get_metric("mse", "", Shape{4, 2}, Shape{4, 2})->name() == "mse");
    CHECK(get_metric("auc", "", Shape{4, 1}, Shape{4, 1})->class_name() == "AUC");
    CHECK(get_metric("top_k_categorical_accuracy", "", Shape{4, 9}, Shape{4, 9})->name() ==
          "top_k_categorical_accuracy");
    CHECK_THROWS_WITH_AS(get_metric("foo", "", Shape{4}, Shape{4, 2}),
                         doctest::Contains("unknown metric 'foo'; known: accuracy"), ConfigError);
  }
}

namespace {

namespace metrics = loadstar::keras::metrics;
using loadstar::keras::Metric;
using loadstar::keras::Registry;

// The reference values of tests/keras/generate_losses_metrics_34.py.
const nlohmann::json& metric_reference_34() {
  static const nlohmann::json json = reference_values::load_reference("losses_metrics_34.json");
  return json;
}

struct Batch {
  Tensor<float> y_true, y_pred, weights;
  bool weighted = false;
};

std::vector<Batch> batches_of(const nlohmann::json& c) {
  std::vector<Batch> out;
  for (const auto& b : c["batches"]) {
    Batch batch{tensor_of(b["y_true"], b["y_true_shape"]),
                tensor_of(b["y_pred"], b["y_pred_shape"]), Tensor<float>(),
                !b["sample_weight"].is_null()};
    if (batch.weighted) {
      batch.weights = tensor_of(b["sample_weight"], nlohmann::json::array({batch.y_pred.rows()}));
    }
    out.push_back(std::move(batch));
  }
  return out;
}

void update(Metric& metric, const Batch& b) {
  metric.update_state(b.y_true, b.y_pred, b.weighted ? &b.weights : nullptr);
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Metrics of Keras 3 match the NumPy reference over three batches") {
    // Each metric made from its Keras config through the registry; float64 accumulation of
    // float32 inputs (the loss metrics keep float32 per-sample values): 1e-6 absolute plus 1e-5
    // relative.
    for (const auto& c : metric_reference_34()["metrics"]) {
      if (!c.contains("results")) continue;
      const std::string name = c["name"];
      CAPTURE(name);
      auto metric =
          Registry<Metric>::instance().create(c["class_name"].get<std::string>(), c["config"]);
      const auto batches = batches_of(c);
      const auto targets = c["results"].get<std::vector<double>>();
      for (int pass = 0; pass < 2; ++pass) {  // the second pass checks reset_state
        std::vector<float> results;
        for (const auto& b : batches) {
          update(*metric, b);
          results.push_back(static_cast<float>(metric->result()));
        }
        check_close(name, results, targets, 1e-6, 1e-5);
        metric->reset_state();
      }
      // A checkpoint after the first batch: a metric rebuilt from the config and given the state
      // goes on to the same results.
      update(*metric, batches[0]);
      auto restored = Registry<Metric>::instance().create(c["class_name"].get<std::string>(),
                                                          metric->get_config());
      CHECK(restored->get_config() == metric->get_config());
      restored->set_state(nlohmann::json::parse(metric->get_state().dump()));
      std::vector<float> results{static_cast<float>(restored->result())};
      for (std::size_t i = 1; i < batches.size(); ++i) {
        update(*restored, batches[i]);
        results.push_back(static_cast<float>(restored->result()));
      }
      check_close(name + " restored", results, targets, 1e-6, 1e-5);
      // clone() keeps the state too.
      CHECK(restored->clone()->result() == restored->result());
    }
  }

  TEST_CASE("AUC names the predictions and arguments that do not fit its labels") {
    const Tensor<float> y = Tensor<float>(Shape{2, 3}, 1.0F);
    metrics::AUC per_label({.multi_label = true});
    CHECK_THROWS_WITH_AS(per_label.update_state(Tensor<float>(Shape{2, 3, 1}, 1.0F),
                                                Tensor<float>(Shape{2, 3, 1}, 0.5F), nullptr),
                         "auc: with multi_label, y_pred must have rank 2 (samples, labels) but has "
                         "shape (2, 3, 1)",
                         ShapeError);
    metrics::AUC two_labels({.multi_label = true, .num_labels = 2});
    CHECK_THROWS_WITH_AS(two_labels.update_state(y, y, nullptr),
                         "auc: counts 2 labels but y_pred has shape (2, 3)", ShapeError);
    metrics::AUC weighted({.label_weights = {1.0, 2.0}});
    CHECK_THROWS_WITH_AS(weighted.update_state(y, y, nullptr),
                         "auc: label_weights has 2 weights but y_pred of shape (2, 3) has 3 labels "
                         "on its last axis",
                         ShapeError);
    CHECK_THROWS_WITH_AS(metrics::AUC({.thresholds = {0.5, 1.5}}),
                         "auc: thresholds must lie in [0, 1] but one is 1.500000", ConfigError);
    CHECK_THROWS_WITH_AS(metrics::AUC({.label_weights = {1.0, -1.0}}),
                         "auc: label_weights must be non-negative but one is -1.000000",
                         ConfigError);
    // Before a batch has said how many labels there are, the result is 0.
    CHECK(per_label.result() == 0.0);
    // A checkpoint of another number of labels is refused.
    metrics::AUC three_labels({.multi_label = true, .num_labels = 3});
    CHECK_THROWS_WITH_AS(three_labels.set_state(two_labels.get_state()),
                         "auc state: expected the counts of 3 labels but found 2",
                         loadstar::CheckpointError);
  }

  TEST_CASE("F1Score and R2Score without aggregation give one score per class") {
    for (const auto& c : metric_reference_34()["metrics"]) {
      if (!c.contains("scores")) continue;
      const std::string name = c["name"];
      CAPTURE(name);
      auto metric =
          Registry<Metric>::instance().create(c["class_name"].get<std::string>(), c["config"]);
      for (const auto& b : batches_of(c))
        update(*metric, b);
      std::vector<double> scores;
      if (auto* f = dynamic_cast<metrics::FBetaScore*>(metric.get())) scores = f->scores();
      if (auto* r = dynamic_cast<metrics::R2Score*>(metric.get())) scores = r->scores();
      const std::vector<float> values(scores.begin(), scores.end());
      check_close(name, values, c["scores"].get<std::vector<double>>(), 1e-6, 1e-5);
      CHECK_THROWS_WITH_AS(metric->result(), doctest::Contains("gives one score per"), ConfigError);
    }
  }

  TEST_CASE("The further metrics resolve by Keras's names with Keras's defaults") {
    const Shape two{4, 3};
    CHECK(get_metric("root_mean_squared_error", "", two, two)->class_name() ==
          "RootMeanSquaredError");
    CHECK(get_metric("bce", "", two, two)->name() == "bce");
    CHECK(get_metric("bce", "", two, two)->class_name() == "BinaryCrossentropy");
    CHECK(get_metric("logcosh", "", two, two)->class_name() == "LogCoshError");
    CHECK(get_metric("kld", "", two, two)->class_name() == "KLDivergence");
    CHECK(get_metric("f1_score", "", two, two)->get_config() ==
          nlohmann::json{{"name", "f1_score"},
                         {"dtype", "float32"},
                         {"average", nullptr},
                         {"threshold", nullptr}});
    CHECK(get_metric("fbeta_score", "", two, two)->get_config()["beta"] == 1.0);
    CHECK(get_metric("r2_score", "", two, two)->get_config() ==
          nlohmann::json{{"name", "r2_score"},
                         {"dtype", "float32"},
                         {"class_aggregation", "uniform_average"},
                         {"num_regressors", 0}});
    CHECK(get_metric("binary_io_u", "", two, two)->get_config() ==
          nlohmann::json{{"name", "binary_io_u"},
                         {"dtype", "float32"},
                         {"target_class_ids", {0, 1}},
                         {"threshold", 0.5}});
    CHECK(get_metric("cosine_similarity", "", two, two)->get_config() ==
          nlohmann::json{{"name", "cosine_similarity"}, {"dtype", "float32"}, {"axis", -1}});
    auto& registry = Registry<Metric>::instance();
    CHECK(registry.create("MeanIoU", {{"num_classes", 3}})->name() == "mean_io_u");
    // Keras 3 writes the IoU metrics' dtype as an integer type.
    CHECK(
        registry.create("OneHotMeanIoU", {{"num_classes", 3}, {"dtype", "int32"}})->get_config() ==
        nlohmann::json{{"name", "one_hot_mean_io_u"},
                       {"dtype", "int32"},
                       {"num_classes", 3},
                       {"ignore_class", nullptr},
                       {"sparse_y_pred", false},
                       {"axis", -1}});
    CHECK(registry.create("PrecisionAtRecall", {{"recall", 0.8}})->get_config() ==
          nlohmann::json{{"name", "precision_at_recall"},
                         {"dtype", "float32"},
                         {"num_thresholds", 200},
                         {"recall", 0.8},
                         {"class_id", nullptr}});
    CHECK(registry.create("AUC", {{"curve", "pr"}, {"summation_method", "Majoring"}})
              ->get_config()["curve"] == "PR");
    CHECK(registry.create("SparseCategoricalCrossentropy", {{"from_logits", true}})->get_config() ==
          nlohmann::json{{"name", "sparse_categorical_crossentropy"},
                         {"dtype", "float32"},
                         {"from_logits", true},
                         {"ignore_class", nullptr},
                         {"axis", -1}});
  }

  TEST_CASE("The further metrics reject bad configs and shapes naming the metric") {
    auto& registry = Registry<Metric>::instance();
    CHECK_THROWS_WITH_AS(registry.create("FBetaScore", {{"average", "samples"}}),
                         doctest::Contains("metric (FBetaScore): config.average: expected null, "
                                           "\"micro\", \"macro\" or \"weighted\" but found "
                                           "\"samples\""),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("FBetaScore", {{"beta", 0.0}}),
                         doctest::Contains("fbeta_score (FBetaScore): beta must be above 0 but "
                                           "is 0.0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("F1Score", {{"threshold", 1.5}}),
                         doctest::Contains("threshold must be in (0, 1] but is 1.5"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("F1Score", {{"beta", 2.0}}),
                         doctest::Contains("config.beta: expected 1.0"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("R2Score", {{"class_aggregation", "mean"}}),
                         doctest::Contains("config.class_aggregation: expected null, "
                                           "\"uniform_average\" or \"variance_weighted_average\""),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("R2Score", {{"num_regressors", -1}}),
                         doctest::Contains("config.num_regressors: expected a non-negative "
                                           "integer but found -1"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("IoU", {{"num_classes", 3}, {"target_class_ids", {0, 3}}}),
        doctest::Contains("io_u: target class id 3 is outside [0, num_classes) with "
                          "num_classes 3"),
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("MeanIoU", {{"num_classes", 3}, {"axis", 1}}),
                         doctest::Contains("config.axis: expected -1"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("MeanIoU", {{"num_classes", 3}, {"dtype", "float16"}}),
                         doctest::Contains("config.dtype: expected \"float32\" or an integer "
                                           "type"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("AUC", {{"curve", "DET"}}),
                         doctest::Contains("config.curve: expected \"ROC\", \"PR\" or "
                                           "\"PRGAIN\" but found \"DET\""),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("AUC", {{"summation_method", "simpson"}}),
                         doctest::Contains("config.summation_method: expected"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("RecallAtPrecision", {{"precision", 1.2}}),
                         doctest::Contains("recall_at_precision: precision must be in [0, 1] "
                                           "but is 1.2"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("SensitivityAtSpecificity", nlohmann::json::object()),
                         doctest::Contains("config.specificity: expected a number but found "
                                           "nothing"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("SparseCategoricalCrossentropy", {{"ignore_class", 0}}),
                         doctest::Contains("config.ignore_class: expected null"), ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("CosineSimilarity", {{"axis", 0}}),
                         doctest::Contains("config.axis: expected -1"), ConfigError);

    Tensor<float> a({4, 3}), b({4, 2}), flat({4});
    CHECK_THROWS_WITH_AS(
        get_metric("r2_score", "", flat.shape(), flat.shape())->update_state(flat, flat, nullptr),
        doctest::Contains("r2_score: expects 2-D y_true and y_pred of one shape "
                          "(batch_size, outputs) but found y_true of shape (4,)"),
        ShapeError);
    auto f1 = get_metric("f1_score", "", a.shape(), a.shape());
    f1->update_state(a, a, nullptr);
    CHECK_THROWS_WITH_AS(f1->update_state(b, b, nullptr),
                         doctest::Contains("f1_score: y_pred of shape (4, 2) has 2 classes but "
                                           "the batches before had 3"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(get_metric("categorical_crossentropy", "", a.shape(), b.shape())
                             ->update_state(a, b, nullptr),
                         doctest::Contains("categorical_crossentropy: y_true of shape (4, 3) does "
                                           "not match y_pred of shape (4, 2)"),
                         ShapeError);
    auto scce = get_metric("sparse_categorical_crossentropy", "", flat.shape(), a.shape());
    CHECK_THROWS_WITH_AS(scce->update_state(Tensor<float>({4}, {0, 1, 3, 2}), a, nullptr),
                         doctest::Contains("sparse_categorical_crossentropy: label 3 at row 2 is "
                                           "outside [0, 3)"),
                         ConfigError);
    auto at = registry.create("PrecisionAtRecall", {{"recall", 0.5}, {"class_id", 3}});
    CHECK_THROWS_WITH_AS(at->update_state(a, a, nullptr),
                         doctest::Contains("precision_at_recall: class_id 3 needs y_true and "
                                           "y_pred of one shape with more classes"),
                         ShapeError);
    auto iou = registry.create("MeanIoU", {{"num_classes", 3}});
    CHECK_THROWS_WITH_AS(iou->set_state({{"total_confusion_matrix", {1.0, 2.0}}}),
                         doctest::Contains("mean_io_u state: expected a confusion matrix of 9 "
                                           "counts but found 2"),
                         loadstar::CheckpointError);
    Tensor<float> weights({3});
    CHECK_THROWS_WITH_AS(iou->update_state(flat, flat, &weights),
                         doctest::Contains("mean_io_u: sample_weight of shape (3,) needs one "
                                           "weight per row"),
                         ShapeError);
  }

  TEST_CASE("A renamed loss metric names itself in its errors") {
    auto metric = get_metric("kld", "", Shape{2, 3}, Shape{2, 3});
    metric->update_state(Tensor<float>({2, 3}, 0.5f), Tensor<float>({2, 3}, 0.5f), nullptr);
    metric->set_name("val_kld");
    CHECK_THROWS_WITH_AS(
        metric->update_state(Tensor<float>({2, 3}), Tensor<float>({2, 2}), nullptr),
        doctest::Contains("val_kld: y_true of shape (2, 3) does not match y_pred of shape (2, 2)"),
        ShapeError);
  }
}
