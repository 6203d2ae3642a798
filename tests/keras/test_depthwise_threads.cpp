// The CPU backend's depthwise convolution split over its threads (output rows forward, groups of
// images backward, channel blocks of 16 and a remainder) and the pointwise step of a separable
// convolution read without im2col, against PyTorch reference values
// (tests/keras/generate_depthwise_threads.py), through the backend's default host loops too, and
// the same bits for any thread count.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/protected_backend.hpp"

using loadstar::Shape;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;

// Named (not anonymous): the test executables are unity builds.
namespace depthwise_threads {

const nlohmann::json& reference() {
  static const nlohmann::json data = layer_cases::load("depthwise_threads.json");
  return data;
}

Tensor<float> wave(const Shape& shape, float scale, float phase) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += 0.29F;
  }
  return t;
}

/// A DepthwiseConv2D (40 channels, stride 1, "same") and a SeparableConv2D trained three steps of
/// Adam on `threads` threads: the weights and the predictions after them.
std::vector<Tensor<float>> trained(std::size_t threads) {
  set_random_seed(5);
  auto input = Input({9, 10, 40});
  auto h = call(DepthwiseConv2D(3, {.padding = "same"}), input);
  h = call(SeparableConv2D(8, 3, {.strides = 2, .padding = "same", .activation = "relu"}), h);
  Model model(std::vector{input}, std::vector{h}, "threads");
  model.compile({.optimizer = "adam", .loss = "mse", .threads = threads});
  const Tensor<float> x = wave({6, 9, 10, 40}, 1.5F, 0.0F);
  const Tensor<float> y = wave({6, 5, 5, 8}, 0.5F, 1.0F);
  for (int step = 0; step < 3; ++step)
    model.train_on_batch(x, y);
  auto out = model.get_weights();
  out.push_back(model.predict(x, {.verbose = 0}));
  return out;
}

}  // namespace depthwise_threads

using namespace depthwise_threads;

TEST_SUITE("keras_layers") {
  TEST_CASE("Depthwise convolutions split over threads match the PyTorch reference values") {
    for (std::size_t threads : {1, 2, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : reference()["cases"])
        layer_cases::run_case(c, backend);
    }
    // The backend's default: the same loops on the host, whole.
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : reference()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Depthwise convolutions give the same bits for any thread count") {
    const auto one = trained(1);
    for (std::size_t threads : {2, 3}) {
      CAPTURE(threads);
      const auto other = trained(threads);
      REQUIRE(other.size() == one.size());
      for (std::size_t i = 0; i < one.size(); ++i) {
        CAPTURE(i);
        REQUIRE(other[i].shape() == one[i].shape());
        CHECK(std::memcmp(other[i].data(), one[i].data(), one[i].size() * sizeof(float)) == 0);
      }
    }
  }
}
