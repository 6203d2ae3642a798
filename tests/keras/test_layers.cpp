#include <doctest/doctest.h>

#include <cmath>
#include <loadstar/error.hpp>
#include <loadstar/keras/layers.hpp>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;

TEST_SUITE("keras_layers") {
  TEST_CASE("Dense computes x * kernel + bias and its gradients") {
    CpuBackend backend;
    Dense dense(2, {.name = "fc"});
    const Shape in[] = {Shape{3}};
    CHECK(dense.build(in, 1) == Shape{2});
    REQUIRE(dense.weights().size() == 2);
    CHECK(dense.weights()[0].name == "kernel");
    CHECK(dense.weights()[1].name == "bias");
    dense.weights()[0].value = Tensor<float>({3, 2}, {1, 2, 3, 4, 5, 6});
    dense.weights()[1].value = Tensor<float>({2}, {0.5F, -0.5F});
    const Tensor<float> x({1, 3}, {1, 1, 1});
    Tensor<float> y({1, 2});
    CallContext ctx{.backend = backend};
    dense.forward(std::span(&x, 1), y, ctx);
    CHECK(y(0, 0) == doctest::Approx(9.5));
    CHECK(y(0, 1) == doctest::Approx(11.5));
    CHECK_THROWS_WITH_AS(Dense(2, {.activation = "rleu"}),
                         doctest::Contains("unknown activation 'rleu'; known: linear, relu"),
                         ConfigError);
  }
}

TEST_CASE("Conv2D and MaxPooling2D build the Keras output shapes") {
  Conv2D conv(4, 3, {.padding = "same", .activation = "relu", .name = "c"});
  const Shape in[] = {Shape{5, 5, 2}};
  CHECK(conv.build(in, 1) == Shape{5, 5, 4});
  CHECK(conv.weights()[0].value.shape() == Shape{3, 3, 2, 4});
  MaxPooling2D pool({.name = "p"});
  const Shape pin[] = {Shape{5, 5, 4}};
  CHECK(pool.build(pin, 1) == Shape{2, 2, 4});
  CpuBackend backend;
  CallContext ctx{.backend = backend};
  Tensor<float> x({2, 5, 5, 2}, 0.5F), y({2, 5, 5, 4}), p({2, 2, 2, 4});
  conv.forward(std::span(&x, 1), y, ctx);
  pool.forward(std::span(&y, 1), p, ctx);
}
