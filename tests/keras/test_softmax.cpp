// Softmax over several axes jointly and with masks, given or attached by an earlier layer, against
// the PyTorch reference of tests/keras/generate_softmax.py (Keras 3's Softmax.call written out).
#include <doctest/doctest.h>

#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"

namespace softmax_test {

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

const json& reference() {
  static const json data = layer_cases::load("softmax.json");
  return data;
}

TEST_SUITE("keras_layers") {
  TEST_CASE("Softmax matches the reference over joint axes and with masks") {
    REQUIRE(reference()["cases"].size() == 9);
    for (const std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : reference()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("Softmax reads the mask Masking attaches to its input as Keras 3 does") {
    REQUIRE(reference()["models"].size() == 2);
    for (const auto& c : reference()["models"]) {
      INFO(c["name"].get<std::string>());
      const Shape x_shape = layer_cases::shape_of(c["x_shape"]);
      const Tensor<float> x = layer_cases::tensor_of(c["x"], x_shape);
      const std::vector<int> axes = c["axis"].get<std::vector<int>>();
      auto in = Input(x_shape.row_shape(), "x");
      auto h = call(Dense(3, {.name = "dense"}), call(Masking({.mask_value = 0.0F}), in));
      auto out = call(Softmax({.axes = axes, .name = "softmax"}), h);
      Model model(std::vector{in}, std::vector{out}, "masked_softmax");
      std::vector<Tensor<float>> weights;
      const auto current = model.get_weights();
      for (std::size_t i = 0; i < current.size(); ++i) {
        weights.push_back(layer_cases::tensor_of(
            c["initial_weights"][c["weight_order"][i].get<std::string>()], current[i].shape()));
      }
      model.set_weights(weights);
      model.compile({.optimizer = optimizers::SGD(
                         optimizers::SGDOptions{.learning_rate = reference()["lr"].get<double>()}),
                     .loss = "mse"});
      const Tensor<float> y = layer_cases::tensor_of(c["y"], x_shape);  // 3 units, 3 features
      const double loss = model.train_on_batch(x, y).get("loss").value();
      CHECK(loss == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
      const auto trained = model.get_weights();
      for (std::size_t i = 0; i < trained.size(); ++i) {
        const std::string name = c["weight_order"][i];
        layer_cases::check_close(name, trained[i], c["final_weights"][name]);
      }
      layer_cases::check_close("prediction", model.predict(x, {.verbose = 0}), c["prediction"]);
    }
  }

  TEST_CASE("Softmax refuses an attached mask that Keras 3 cannot broadcast") {
    // Embedding's mask (batch, 5) meets the features (5 steps, 4 features), as in Keras 3, which
    // raises; the batch is refused by name.
    auto tokens = Input(Shape{5}, "tokens");
    auto e = call(Embedding(12, 4, {.mask_zero = true, .name = "words"}), tokens);
    Model model(std::vector{tokens}, std::vector{call(Softmax({.name = "soft"}), e)}, "refusing");
    Tensor<float> ids(Shape{2, 5}, 1.0F);
    CHECK_THROWS_WITH_AS(
        model.predict(ids, {.verbose = 0}),
        "softmax layer 'soft': is given the mask attached to its inputs by an earlier layer, "
        "which Keras 3 broadcasts against them from the last axis; expects it of at most the "
        "inputs' rank whose every axis is 1 or the length of the inputs' axis it meets, counted "
        "from the last (inputs (2, 5, 4)) but got one of shape (2, 5)",
        ShapeError);
    // Masking on (batch, 3): its (batch,) mask meets the 3 features, so a batch of 2 is refused
    // and one of 3 or 1 is not.
    auto in = Input(Shape{3}, "x");
    Model rows(std::vector{in}, std::vector{call(Softmax({.name = "soft"}), call(Masking(), in))},
               "rows");
    CHECK_THROWS_WITH_AS(rows.predict(Tensor<float>(Shape{2, 3}, 1.0F), {.verbose = 0}),
                         doctest::Contains("(inputs (2, 3)) but got one of shape (2,)"),
                         ShapeError);
    CHECK(rows.predict(Tensor<float>(Shape{1, 3}, 1.0F), {.verbose = 0}).shape() == Shape{1, 3});
    // Given a mask as its second input, the mask attached to the inputs as well is refused.
    auto mask = Input(Shape{5, 4}, "mask");
    CHECK_THROWS_WITH_AS(
        Model(
            std::vector{tokens, mask},
            std::vector{call(std::make_shared<Softmax>(SoftmaxOptions{.name = "both"}), {e, mask})},
            "both_masks"),
        "model 'both_masks': softmax layer 'both' takes an input with a mask attached to it "
        "(made by embedding layer 'words'), which loadstar does not apply in this layer; drop the "
        "mask first (mask_zero=False, no Masking layer) or end it before this layer",
        ConfigError);
  }

  TEST_CASE("Softmax writes axis as Keras does and refuses axes that are not joint axes") {
    const auto config_of = [](const json& axis) {
      const json config = {{"name", "s"}, {"trainable", true}, {"axis", axis}};
      return LayerRegistry::instance().create("Softmax", config)->get_config()["axis"];
    };
    CHECK(config_of(-1) == json(-1));
    CHECK(config_of(json::array({1, 2})) == json::array({1, 2}));
    CHECK(config_of(json::array({-1})) == json::array({-1}));
    CHECK(Softmax({.axes = {-2, -1}}).get_config()["axis"] == json::array({-2, -1}));
    CHECK(Softmax({.axis = 2}).get_config()["axis"] == json(2));
    CHECK_THROWS_WITH_AS(static_cast<void>(config_of(json::array())),
                         "layer 's' (Softmax): config.axis: expected an integer or a list of "
                         "integers but found []",
                         ConfigError);
    CHECK_THROWS_WITH_AS(static_cast<void>(config_of(json::array({1, "2"}))),
                         doctest::Contains("an integer or a list of integers"), ConfigError);
    CHECK_THROWS_WITH_AS(call(Softmax({.axes = {1, -2}, .name = "twice"}), Input(Shape{3, 4})),
                         "softmax layer 'twice': axes (1, -2) name axis 1 twice for inputs of "
                         "shape (None, 3, 4)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(call(Softmax({.axes = {0, 1}, .name = "batch"}), Input(Shape{3, 4})),
                         "softmax layer 'batch': axis 0 is not a non-batch axis of inputs of "
                         "shape (None, 3, 4)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(call(Softmax({.axes = {1, 3}, .name = "past"}), Input(Shape{3, 4})),
                         "softmax layer 'past': axis 3 is not a non-batch axis of inputs of "
                         "shape (None, 3, 4)",
                         ConfigError);
  }
}

}  // namespace softmax_test
