// The PyTorch reference of tests/keras/generate_unknown_spatial.py: a fully convolutional model on
// Input(shape=(None, None, 3)) (Conv2D, MaxPooling2D, DepthwiseConv2D, SeparableConv2D,
// Conv2DTranspose, ZeroPadding2D, UpSampling2D and Concatenate), trained one SGD step per batch of
// images of another size each time, run on any backend.
#pragma once

#include <doctest/doctest.h>

#include <loadstar/keras.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"

namespace unknown_spatial_cases {

using loadstar::Shape;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

inline const json& reference() {
  static const json data = layer_cases::load("unknown_spatial.json");
  return data["cases"][0];
}

/// The generator's model, its layers named as the reference's weights.
inline std::shared_ptr<Model> fully_convolutional() {
  auto image = Input(Shape{none, none, 3}, "image");
  auto c1 = call(Conv2D(4, 3, {.padding = "same", .activation = "relu", .name = "conv2d"}), image);
  auto p = call(MaxPooling2D({.pool_size = 2, .name = "pool"}), c1);
  auto d = call(
      DepthwiseConv2D(3, {.padding = "same", .depth_multiplier = 2, .name = "depthwise_conv2d"}),
      p);
  auto s = call(
      SeparableConv2D(6, 3, {.padding = "same", .activation = "relu", .name = "separable_conv2d"}),
      d);
  auto u =
      call(Conv2DTranspose(4, 3, {.strides = 2, .padding = "same", .name = "conv2d_transpose"}), s);
  auto z = call(Conv2D(4, 2, {.name = "padded_conv"}),
                call(ZeroPadding2D(Padding2D(1, 0, 0, 1), {.name = "pad"}), p));
  auto up = call(UpSampling2D(2, {.name = "up"}), z);
  auto joined = call(Concatenate({.name = "joined"}), {c1, u, up});
  auto out = call(Conv2D(1, 1, {.name = "conv2d_1"}), joined);
  return std::make_shared<Model>(std::vector{image}, std::vector{out}, "fully_convolutional");
}

/// The weights of `values` (keyed "<layer>/<weight>") in the model's order.
inline std::vector<Tensor<float>> keyed(const Model& model, const json& values) {
  std::vector<Tensor<float>> out;
  for (const auto& layer : model.layers()) {
    for (const auto& w : layer->weights())
      out.push_back(
          layer_cases::tensor_of(values.at(layer->name() + "/" + w.name), w.value.shape()));
  }
  return out;
}

/// Trains `model` on the reference's batches (one SGD step each, images of another size each
/// time) on `backend` (the CPU when null) and checks every loss, a prediction at another size and
/// the final weights.
inline void check_training(Model& model, std::shared_ptr<Backend> backend = nullptr) {
  const json& c = reference();
  model.set_weights(keyed(model, c["initial_weights"]));
  model.compile(
      {.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = c["lr"].get<double>()}),
       .loss = "mse",
       .backend = std::move(backend)});
  for (std::size_t step = 0; step < c["batches"].size(); ++step) {
    const json& batch = c["batches"][step];
    const Shape shape = layer_cases::shape_of(batch["shape"]);
    INFO("step ", step, " on images of shape ", shape.str());
    const Tensor<float> x = layer_cases::tensor_of(batch["x"], shape);
    const Tensor<float> y =
        layer_cases::tensor_of(batch["y"], Shape{shape[0], shape[1], shape[2], 1});
    const double loss = model.train_on_batch(x, y).get("loss").value();
    CHECK(loss == doctest::Approx(c["losses"][step].get<double>()).epsilon(1e-5));
  }
  const Tensor<float> predicted = model.predict(
      layer_cases::tensor_of(c["predict_x"], layer_cases::shape_of(c["predict_shape"])),
      {.verbose = 0});
  CHECK(predicted.shape() == layer_cases::shape_of(c["prediction_shape"]));
  layer_cases::check_close("prediction", predicted, c["prediction"]);
  const auto trained = model.get_weights();
  const auto expected = keyed(model, c["final_weights"]);
  REQUIRE(trained.size() == expected.size());
  for (std::size_t i = 0; i < trained.size(); ++i) {
    INFO("weight ", i);
    CHECK(trained[i].shape() == expected[i].shape());
  }
  std::size_t i = 0;
  for (const auto& layer : model.layers()) {
    for (const auto& w : layer->weights()) {
      const std::string key = layer->name() + "/" + w.name;
      layer_cases::check_close(key, trained[i++], c["final_weights"][key]);
    }
  }
}

}  // namespace unknown_spatial_cases
