// The preprocessing layers of saved Keras image models (issue 34): Normalization, Resizing and
// CenterCrop against PyTorch reference values (tests/keras/generate_preprocessing_34.py), Keras's
// adapt example, configs, .h5 and .keras files, training through them, and the errors that name
// the layer.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <loadstar/keras/saving/saving.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/protected_backend.hpp"
#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

namespace preprocessing_34 {

const json& preprocessing_reference() {
  static const json data = layer_cases::load("preprocessing_34.json");
  return data;
}

Tensor<float> ramp(const Shape& shape, float scale, float phase = 0.0F) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += 0.37F;
  }
  return t;
}

/// Positive values (variances) of `shape`.
Tensor<float> positive(const Shape& shape) {
  Tensor<float> t = ramp(shape, 1.0F, 1.0F);
  for (float& x : t)
    x = x * x + 0.5F;
  return t;
}

bool identical(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A model of `layer` then a Dense layer on inputs of `shape`, its non-trainable weights set from
/// `statistics` (when given), trained two SGD steps: the config rebuilds it, and its .h5 and
/// .keras files load with the same config, weights and predictions, bit for bit; training
/// moves the Dense kernel (through the layer's input gradient) and not the statistics.
void check_round_trip(const std::shared_ptr<Layer>& layer, const Shape& shape,
                      const std::vector<Tensor<float>>& statistics = {}) {
  INFO(layer->class_name(), " ", layer->get_config().dump());
  auto input = Input(shape, "in");
  auto out = call(std::make_shared<Dense>(2, DenseOptions{.name = "dense"}),
                  call(std::make_shared<Flatten>(), call(layer, input)));
  auto model = std::make_shared<Model>(std::vector{input}, std::vector{out}, "preprocessed");
  if (!statistics.empty()) {
    auto weights = model->get_weights();
    for (std::size_t i = 0; i < statistics.size(); ++i)
      weights[i] = statistics[i];
    model->set_weights(weights);
  }
  const Tensor<float> x = ramp(shape.prepend(3), 1.5F);
  const Tensor<float> y = ramp(Shape{3, 2}, 0.5F, 1.0F);
  model->compile({.optimizer = "sgd", .loss = "mse"});
  const auto before = model->get_weights();
  model->train_on_batch(x, y);
  model->train_on_batch(x, y);
  const auto after = model->get_weights();
  for (std::size_t i = 0; i < statistics.size(); ++i)
    CHECK(identical(after[i], before[i]));  // the statistics do not train
  CHECK_FALSE(identical(after[statistics.size()], before[statistics.size()]));
  const json full = model_get_config(*model);
  const auto copy = model_from_config(full);
  CHECK(model_get_config(*copy) == full);
  copy->set_weights(after);
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  CHECK(identical(copy->predict(x, {.verbose = 0}), expected));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(model_get_config(*loaded) == full);
    const auto weights = loaded->get_weights();
    REQUIRE(weights.size() == after.size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(identical(weights[i], after[i]));
    CHECK(identical(loaded->predict(x, {.verbose = 0}), expected));
  }
}

}  // namespace preprocessing_34

TEST_SUITE("keras_layers") {
  using namespace preprocessing_34;

  TEST_CASE("Normalization Resizing and CenterCrop match the PyTorch reference values") {
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : preprocessing_reference()["cases"])
        layer_cases::run_case(c, backend);
    }
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : preprocessing_reference()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Normalization adapts to data as Keras's example does") {
    // Keras's documented example: per-feature mean [1, 8, 5] and variance [1, 1, 1].
    Normalization norm({.name = "norm"});
    const float data[] = {0, 7, 4, 2, 9, 6, 0, 7, 4, 2, 9, 6};
    norm.adapt(Tensor<float>(Shape{4, 3}, std::span<const float>(data)));
    REQUIRE(norm.weights().size() == 3);
    CHECK(norm.weights()[0].name == "mean");
    CHECK(norm.weights()[1].name == "variance");
    CHECK(norm.weights()[2].name == "count");
    CHECK(norm.weights()[2].value.shape() == Shape{});
    const float mean[] = {1, 8, 5};
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(norm.weights()[0].value.data()[i] == doctest::Approx(mean[i]));
      CHECK(norm.weights()[1].value.data()[i] == doctest::Approx(1.0));
      CHECK_FALSE(norm.weights()[i].trainable);
    }
    CHECK(norm.weights()[2].value.data()[0] == 4.0F);
    CpuBackend backend(1);
    const Tensor<float> x(Shape{1, 3}, std::span<const float>(data, 3));
    const Tensor<float> y(Shape{1, 3});
    norm.forward(std::span(&x, 1), y, {.backend = backend});
    for (float v : y)
      CHECK(v == doctest::Approx(-1.0));
    // axis None: one mean and variance, as Keras's example [1..5] -> mean 3, variance 2.
    Normalization global({.axis = {}});
    const float five[] = {1, 2, 3, 4, 5};
    global.adapt(Tensor<float>(Shape{5, 1}, std::span<const float>(five)));
    CHECK(global.weights()[0].value.shape() == Shape{});
    CHECK(global.weights()[0].value.data()[0] == doctest::Approx(3.0));
    CHECK(global.weights()[1].value.data()[0] == doctest::Approx(2.0));
  }

  TEST_CASE("Normalization Resizing and CenterCrop round-trip configs h5 and keras files") {
    auto& registry = LayerRegistry::instance();
    check_round_trip(registry.create("Normalization", {{"name", "norm"}}), Shape{4, 3},
                     {ramp(Shape{3}, 2.0F), positive(Shape{3}), Tensor<float>(Shape{}, 12.0F)});
    check_round_trip(
        registry.create("Normalization", {{"axis", {1, 2}}, {"invert", true}}), Shape{2, 3},
        {ramp(Shape{2, 3}, 2.0F), positive(Shape{2, 3}), Tensor<float>(Shape{}, 5.0F)});
    check_round_trip(
        registry.create("Normalization", {{"axis", nullptr}, {"mean", 0.5}, {"variance", 4.0}}),
        Shape{3, 2});
    check_round_trip(registry.create("Resizing", {{"height", 5}, {"width", 3}}), Shape{4, 6, 2});
    check_round_trip(registry.create("Resizing", {{"height", 3},
                                                  {"width", 3},
                                                  {"interpolation", "nearest"},
                                                  {"crop_to_aspect_ratio", true}}),
                     Shape{4, 6, 2});
    check_round_trip(registry.create("Resizing", {{"height", 4},
                                                  {"width", 2},
                                                  {"interpolation", "lanczos5"},
                                                  {"pad_to_aspect_ratio", true},
                                                  {"fill_value", 0.5},
                                                  {"antialias", true}}),
                     Shape{4, 6, 2});
    check_round_trip(registry.create("UpSampling2D", {{"size", {2, 3}}, {"interpolation", "area"}}),
                     Shape{3, 4, 2});
    check_round_trip(registry.create("CenterCrop", {{"height", 2}, {"width", 3}}), Shape{4, 6, 2});
    check_round_trip(registry.create("CenterCrop", {{"height", 5}, {"width", 5}}), Shape{4, 6, 2});
  }

  TEST_CASE("Normalization Resizing and CenterCrop write Keras's configs") {
    CHECK(Normalization({.name = "n"}).get_config() ==
          json::parse(R"({"name": "n", "trainable": true, "dtype": "float32", "axis": [-1],
              "invert": false, "mean": null, "variance": null})"));
    CHECK(Normalization({.axis = {}, .mean = {1.0, 2.0}, .variance = {3.0, 4.0}, .invert = true})
              .get_config() ==
          json::parse(R"({"name": "", "trainable": true, "dtype": "float32", "axis": [],
              "invert": true, "mean": [1.0, 2.0], "variance": [3.0, 4.0]})"));
    CHECK(Resizing(4, 5, {.name = "r"}).get_config() ==
          json::parse(R"({"name": "r", "trainable": true, "dtype": "float32", "height": 4,
              "width": 5, "interpolation": "bilinear", "crop_to_aspect_ratio": false,
              "pad_to_aspect_ratio": false, "fill_mode": "constant", "fill_value": 0.0,
              "antialias": false, "data_format": "channels_last"})"));
    CHECK(CenterCrop(4, 5, "c").get_config() ==
          json::parse(R"({"name": "c", "trainable": true, "dtype": "float32", "height": 4,
              "width": 5, "data_format": "channels_last"})"));
    auto& registry = LayerRegistry::instance();
    // tf.keras 2 writes Resizing without pad_to_aspect_ratio, antialias or data_format, and
    // Normalization's axis as a list; Keras 3 writes data_format null when it is the default.
    CHECK(registry.create("Resizing", {{"height", 2}, {"width", 3}, {"interpolation", "nearest"}})
              ->get_config()["interpolation"] == "nearest");
    CHECK(registry.create("CenterCrop", {{"height", 2}, {"width", 3}, {"data_format", nullptr}})
              ->get_config()["data_format"] == "channels_last");
    CHECK(registry.create("Normalization", {{"axis", 2}})->get_config()["axis"] ==
          json::parse("[2]"));
  }

  TEST_CASE("Normalization Resizing and CenterCrop name themselves in errors") {
    CHECK_THROWS_WITH_AS(Normalization({.mean = 1.0, .name = "n"}),
                         "normalization layer 'n': mean and variance must be given together but "
                         "only mean is set",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Normalization({.mean = {1.0, 2.0}, .variance = 1.0, .name = "n"}),
                         "normalization layer 'n': mean and variance must have the same shape but "
                         "mean is [1.0,2.0] and variance is 1.0",
                         ConfigError);
    Normalization three({.mean = {1.0, 2.0, 3.0}, .variance = {1.0, 1.0, 1.0}, .name = "n"});
    const Shape four[] = {Shape{2, 4}};
    CHECK_THROWS_WITH_AS(three.build(four, 0),
                         "normalization layer 'n': mean and variance must hold 1 or 4 values for "
                         "the kept axes of inputs of shape (None, 2, 4) but hold 3",
                         ShapeError);
    Normalization batch_axis({.axis = {0}, .name = "n"});
    CHECK_THROWS_WITH_AS(batch_axis.build(four, 0),
                         "normalization layer 'n': axis 0 is not a distinct non-batch axis of "
                         "inputs of shape (None, 2, 4)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(three.adapt(Tensor<float>(Shape{2, 3})),
                         "normalization layer 'n': adapt needs a layer without a mean and variance "
                         "in its config",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Resizing(2, 2, {.interpolation = "gaussian", .name = "r"}),
                         "resizing layer 'r': interpolation must be \"bilinear\", \"nearest\", "
                         "\"bicubic\", \"lanczos3\", \"lanczos5\" or \"area\" but is "
                         "\"gaussian\"",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        Resizing(2, 2, {.crop_to_aspect_ratio = true, .pad_to_aspect_ratio = true, .name = "r"}),
        "resizing layer 'r': expected at most one of crop_to_aspect_ratio and pad_to_aspect_ratio "
        "but both are true",
        ConfigError);
    CHECK_THROWS_WITH_AS(CenterCrop(0, 2, "c"),
                         "center_crop layer 'c': height and width must be positive but are 0 and 2",
                         ConfigError);
    Resizing resize(2, 2, {.name = "r"});
    const Shape flat[] = {Shape{4, 3}};
    CHECK_THROWS_WITH_AS(resize.build(flat, 0),
                         "resizing layer 'r': expects images (batch, height, width, channels) of "
                         "known channels but got inputs of shape (None, 4, 3)",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create("Resizing",
                        {{"name", "r"}, {"height", 2}, {"width", 2}, {"fill_mode", "reflect"}}),
        doctest::Contains("resizing layer 'r': fill_mode must be \"constant\" (Keras's resize has "
                          "no other) but is \"reflect\""),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create(
            "CenterCrop",
            {{"name", "c"}, {"height", 2}, {"width", 2}, {"data_format", "channels_first"}}),
        "layer 'c' (CenterCrop): config.data_format: expected null or "
        "\"channels_last\" but found \"channels_first\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("Normalization", {{"name", "n"}, {"mean", "zero"}}),
                         "layer 'n' (Normalization): config.mean: expected null, a number or a "
                         "list of numbers but found \"zero\"",
                         ConfigError);
  }
}
