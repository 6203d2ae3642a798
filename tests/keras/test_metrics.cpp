#include <doctest/doctest.h>

#include <loadstar/error.hpp>
#include <loadstar/keras/metrics.hpp>
#include <loadstar/tensor.hpp>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::keras::get_metric;

TEST_SUITE("keras") {
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
