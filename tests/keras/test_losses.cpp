#include <doctest/doctest.h>

#include <loadstar/error.hpp>
#include <loadstar/keras/losses.hpp>
#include <loadstar/tensor.hpp>

using loadstar::ConfigError;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::keras::get_loss;

TEST_SUITE("keras") {
  TEST_CASE("get_loss resolves Keras strings and rejects unknown names") {
    CHECK(get_loss("mse")->class_name() == "MeanSquaredError");
    CHECK(get_loss("sparse_categorical_crossentropy")->name() == "sparse_categorical_crossentropy");
    CHECK(get_loss("kld")->class_name() == "KLDivergence");
    CHECK_THROWS_WITH_AS(get_loss("foo"), doctest::Contains("unknown loss 'foo'; known: mse"),
                         ConfigError);
  }

  TEST_CASE("SparseCategoricalCrossentropy rejects labels outside the classes") {
    auto loss = get_loss("sparse_categorical_crossentropy");
    Tensor<float> labels({4}, {1, 2, 3, 12});
    Tensor<float> probabilities({4, 10}, 0.1f);
    CHECK_THROWS_WITH_AS(
        loss->compute(labels, probabilities, nullptr, Tensor<float>()),
        doctest::Contains("sparse_categorical_crossentropy: label 12 at row 3 is outside [0, 10)"),
        ConfigError);
  }
}
