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
