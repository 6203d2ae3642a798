// The cropping, zero padding and up-sampling layers of 1 and 3 spatial axes, the activation layers
// with parameters and the further layers of issue 34: PyTorch reference values
// (tests/keras/generate_layers_34.py), configs and weights through model_from_config, .h5 and
// .keras files, and the errors that name the layer.

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

namespace {

const json& reference_34() {
  static const json data = layer_cases::load("layers_34.json");
  return data;
}

Tensor<float> wave(const Shape& shape, float scale, float phase = 0.0F) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += 0.41F;
  }
  return t;
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A model of one `class_name` layer (from `config`) on an input of `shape`, trained two steps of
/// SGD on a squared error so that its weights move: its config rebuilds the same model, and its
/// .h5 and .keras files load into models with the same config, weights and predictions, bit for
/// bit.
void check_saved_round_trip(const std::string& class_name, const json& config, const Shape& shape) {
  INFO(class_name, " ", config.dump());
  auto input = Input(shape, "in");
  auto out = call(LayerRegistry::instance().create(class_name, config), input);
  auto model = std::make_shared<Model>(std::vector{input}, std::vector{out}, "round_trip");
  const Tensor<float> x = wave(shape.prepend(4), 1.5F);
  const Tensor<float> y = wave(out.shape().prepend(4), 0.5F, 1.0F);
  model->compile({.optimizer = "sgd", .loss = "mse"});
  model->train_on_batch(x, y);
  model->train_on_batch(x, y);
  const json full = model_get_config(*model);
  const auto copy = model_from_config(full);
  CHECK(model_get_config(*copy) == full);
  copy->set_weights(model->get_weights());
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  CHECK(same_bits(copy->predict(x, {.verbose = 0}), expected));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(model_get_config(*loaded) == full);
    const auto weights = loaded->get_weights();
    REQUIRE(weights.size() == model->get_weights().size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(same_bits(weights[i], model->get_weights()[i]));
    CHECK(same_bits(loaded->predict(x, {.verbose = 0}), expected));
  }
}

/// The first weight of the one layer of a `check_saved_round_trip`-style model after `steps`
/// steps, to show that training moves it.
Tensor<float> trained_weight(const std::string& class_name, const json& config, const Shape& shape,
                             int steps) {
  auto input = Input(shape, "in");
  auto out = call(LayerRegistry::instance().create(class_name, config), input);
  Model model(std::vector{input}, std::vector{out}, "trained");
  model.compile({.optimizer = "sgd", .loss = "mse"});
  for (int i = 0; i < steps; ++i)
    model.train_on_batch(wave(shape.prepend(4), 1.5F), wave(out.shape().prepend(4), 0.5F, 1.0F));
  return model.get_weights().at(0);
}

}  // namespace

TEST_SUITE("keras_layers") {
  TEST_CASE("The issue 34 layers match the PyTorch reference values with one and three threads") {
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : reference_34()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("The issue 34 layers compute only through the backend") {
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : reference_34()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Cropping ZeroPadding and UpSampling layers round-trip configs h5 and keras files") {
    check_saved_round_trip("Cropping1D", {{"cropping", {1, 2}}}, Shape{6, 2});
    check_saved_round_trip("Cropping2D", {{"cropping", {{1, 0}, {0, 2}}}}, Shape{4, 5, 2});
    check_saved_round_trip("Cropping2D", {{"cropping", 1}, {"data_format", "channels_first"}},
                           Shape{2, 4, 4});
    check_saved_round_trip("Cropping3D", json::object(), Shape{3, 4, 5, 2});
    check_saved_round_trip("ZeroPadding1D", {{"padding", {0, 2}}}, Shape{3, 2});
    check_saved_round_trip("ZeroPadding1D", {{"padding", 1}, {"data_format", "channels_first"}},
                           Shape{2, 3});
    check_saved_round_trip("ZeroPadding3D", {{"padding", {1, 0, 2}}}, Shape{2, 2, 2, 1});
    check_saved_round_trip("UpSampling1D", {{"size", 3}}, Shape{2, 3});
    check_saved_round_trip("UpSampling3D", {{"size", {1, 2, 2}}, {"data_format", "channels_first"}},
                           Shape{2, 2, 2, 2});
  }

  TEST_CASE("Cropping ZeroPadding and UpSampling layers write Keras's configs") {
    CHECK(Cropping1D({1, 2}, "c").get_config() ==
          json::parse(R"({"name": "c", "trainable": true, "dtype": "float32",
              "cropping": [1, 2]})"));
    CHECK(Cropping2D({}, {.name = "c"}).get_config() ==
          json::parse(R"({"name": "c", "trainable": true, "dtype": "float32",
              "cropping": [[0, 0], [0, 0]], "data_format": "channels_last"})"));
    CHECK(Cropping3D().get_config()["cropping"] == json::parse("[[1, 1], [1, 1], [1, 1]]"));
    CHECK(ZeroPadding1D().get_config() ==
          json::parse(R"({"name": "", "trainable": true, "dtype": "float32",
              "padding": [1, 1]})"));
    CHECK(ZeroPadding1D({1, 1}, {.data_format = "channels_first"}).get_config()["data_format"] ==
          "channels_first");
    CHECK(ZeroPadding3D({{{0, 1}, {2, 3}, {4, 5}}}).get_config()["padding"] ==
          json::parse("[[0, 1], [2, 3], [4, 5]]"));
    CHECK(UpSampling1D().get_config()["size"] == 2);
    CHECK(UpSampling3D().get_config() ==
          json::parse(R"({"name": "", "trainable": true, "dtype": "float32", "size": [2, 2, 2],
              "data_format": "channels_last"})"));
    auto& registry = LayerRegistry::instance();
    // tf.keras 2 writes 1-tuples as lists: UpSampling1D's size [3].
    CHECK(registry.create("UpSampling1D", {{"size", {3}}})->get_config()["size"] == 3);
    CHECK(registry.create("Cropping3D", {{"cropping", 2}})->get_config()["cropping"] ==
          json::parse("[[2, 2], [2, 2], [2, 2]]"));
    CHECK(registry.create("ZeroPadding3D", {{"padding", {1, 2, 3}}})->get_config()["padding"] ==
          json::parse("[[1, 1], [2, 2], [3, 3]]"));
  }

  TEST_CASE("Cropping ZeroPadding and UpSampling layers name themselves in errors") {
    Cropping2D crop({{{2, 2}, {0, 0}}}, {.name = "c"});
    const Shape small[] = {Shape{4, 3, 1}};
    CHECK_THROWS_WITH_AS(crop.build(small, 0),
                         "cropping2d layer 'c': cropping 2 and 2 of spatial axis 0 leaves nothing "
                         "of inputs of shape (None, 4, 3, 1)",
                         ShapeError);
    Cropping1D crop1({1, 1}, "c1");
    CHECK_THROWS_WITH_AS(crop1.build(small, 0),
                         "cropping1d layer 'c1': expects rank-2 inputs (without the batch axis) "
                         "but got (4, 3, 1)",
                         ShapeError);
    ZeroPadding3D pad({}, {.name = "z"});
    CHECK_THROWS_WITH_AS(pad.build(small, 0),
                         "zero_padding3d layer 'z': expects rank-4 inputs (without the batch "
                         "axis) but got (4, 3, 1)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(UpSampling3D({2, 0, 2}, {.name = "u"}),
                         "up_sampling3d layer 'u': size must be positive but is 0", ConfigError);
    CHECK_THROWS_WITH_AS(Cropping3D({}, {.data_format = "nhwc", .name = "c3"}),
                         "cropping3d layer 'c3': data_format must be 'channels_last' or "
                         "'channels_first' but is 'nhwc'",
                         ConfigError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create("Cropping2D", {{"name", "c"}, {"cropping", {1, 2, 3}}}),
        "layer 'c' (Cropping2D): config.cropping: expected a non-negative integer, a list of 2 or "
        "a list of 2 pairs but found [1,2,3]",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("ZeroPadding1D", {{"name", "z"}, {"padding", {1, 2, 3}}}),
        "layer 'z' (ZeroPadding1D): config.padding: expected a non-negative integer or a pair of "
        "them but found [1,2,3]",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("Cropping1D", {{"name", "c"}, {"data_format", "channels_first"}}),
        "layer 'c' (Cropping1D): config.data_format: expected null (Keras's Cropping1D has "
        "channels last) but found \"channels_first\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("UpSampling3D", {{"name", "u"}, {"size", {2, 2}}}),
                         "layer 'u' (UpSampling3D): config.size: expected a positive integer or a "
                         "list of three but found [2,2]",
                         ConfigError);
  }

  TEST_CASE("PReLU ELU ThresholdedReLU and ReLU round-trip configs h5 and keras files") {
    check_saved_round_trip("PReLU", json::object(), Shape{5});
    check_saved_round_trip(
        "PReLU",
        {{"shared_axes", {1, 2}},
         {"alpha_initializer", {{"class_name", "Constant"}, {"config", {{"value", 0.2}}}}}},
        Shape{3, 3, 2});
    check_saved_round_trip("ELU", {{"alpha", 0.5}}, Shape{4});
    check_saved_round_trip("ThresholdedReLU", {{"theta", 0.25}}, Shape{4});
    check_saved_round_trip(
        "ReLU", {{"max_value", 0.8}, {"negative_slope", 0.1}, {"threshold", 0.2}}, Shape{6});
    // PReLU's alpha trains: from zeros it moves where inputs are negative.
    const Tensor<float> alpha = trained_weight("PReLU", json::object(), Shape{5}, 3);
    CHECK(alpha.shape() == Shape{5});
    CHECK(std::any_of(alpha.begin(), alpha.end(), [](float a) { return a != 0.0F; }));
  }

  TEST_CASE("PReLU ELU and ThresholdedReLU write Keras's configs and weights") {
    PReLU prelu({.shared_axes = {1, 2}, .name = "p"});
    const Shape image[] = {Shape{4, 5, 3}};
    CHECK(prelu.build(image, 1) == Shape{4, 5, 3});
    REQUIRE(prelu.weights().size() == 1);
    CHECK(prelu.weights()[0].name == "alpha");
    CHECK(prelu.weights()[0].value.shape() == Shape{1, 1, 3});
    CHECK(prelu.get_config() == json::parse(R"({"name": "p", "trainable": true, "dtype": "float32",
              "alpha_initializer": {"class_name": "Zeros", "config": {}},
              "alpha_regularizer": null, "alpha_constraint": null, "shared_axes": [1, 2]})"));
    CHECK(PReLU().get_config()["shared_axes"].is_null());
    CHECK(ELU({.name = "e"}).get_config() ==
          json::parse(R"({"name": "e", "trainable": true, "dtype": "float32", "alpha": 1.0})"));
    CHECK(ThresholdedReLU({.name = "t"}).get_config() ==
          json::parse(R"({"name": "t", "trainable": true, "dtype": "float32", "theta": 1.0})"));
    auto& registry = LayerRegistry::instance();
    CHECK(registry.create("PReLU", {{"shared_axes", 2}})->get_config()["shared_axes"] ==
          json::parse("[2]"));
  }

  TEST_CASE("PReLU ELU ThresholdedReLU and ReLU name themselves in errors") {
    PReLU prelu({.shared_axes = {3}, .name = "p"});
    const Shape rank2[] = {Shape{4, 5}};
    CHECK_THROWS_WITH_AS(prelu.build(rank2, 0),
                         "p_re_lu layer 'p': shared axis 3 is not an axis of inputs of shape "
                         "(None, 4, 5)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(PReLU({.shared_axes = {0}, .name = "p0"}),
                         "p_re_lu layer 'p0': shared_axes cannot hold the batch axis 0",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ThresholdedReLU({.theta = -1.0F, .name = "t"}),
                         "thresholded_re_lu layer 't': theta must be >= 0 but is -1.000000",
                         ConfigError);
    CHECK_THROWS_WITH_AS(ReLU({.threshold = -0.5F, .name = "r"}),
                         "re_lu layer 'r': max_value, negative_slope and threshold must be >= 0",
                         ConfigError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create(
            "PReLU", {{"name", "p"},
                      {"alpha_regularizer", {{"class_name", "L5"}, {"config", {{"l5", 0.01}}}}}}),
        doctest::Contains("layer 'p' (PReLU): config.alpha_regularizer: unknown regularizer 'L5'"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("PReLU", {{"name", "p"}, {"alpha_constraint", "positive"}}),
        doctest::Contains("layer 'p' (PReLU): config.alpha_constraint: unknown constraint "
                          "'positive'"),
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("PReLU", {{"name", "p"}, {"shared_axes", {1, 0}}}),
                         "layer 'p' (PReLU): config.shared_axes: expected a positive axis or a "
                         "list of them but found [1,0]",
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("ThresholdedReLU", {{"name", "t"}, {"theta", -2}}),
                         "layer 't' (ThresholdedReLU): config.theta: expected a number >= 0 but "
                         "found -2",
                         ConfigError);
  }

  TEST_CASE("Dot UnitNormalization Rescaling and GroupNormalization round-trip configs and files") {
    check_saved_round_trip("Rescaling", {{"scale", 0.5}, {"offset", -1.0}}, Shape{3});
    check_saved_round_trip("UnitNormalization", {{"axis", {1, 2}}}, Shape{2, 3});
    check_saved_round_trip("GroupNormalization", {{"groups", 2}}, Shape{3, 4});
    check_saved_round_trip("GroupNormalization",
                           {{"groups", 3}, {"axis", 1}, {"center", false}, {"epsilon", 0.01}},
                           Shape{6, 2});
    // GroupNormalization's gamma trains.
    const Tensor<float> gamma =
        trained_weight("GroupNormalization", {{"groups", 2}}, Shape{3, 4}, 3);
    CHECK(gamma.shape() == Shape{4});
    CHECK(std::any_of(gamma.begin(), gamma.end(), [](float g) { return g != 1.0F; }));
  }

  TEST_CASE("Dot joins two inputs in a model that trains and saves") {
    auto a = Input({3, 4}, "a");
    auto b = Input({5, 4}, "b");
    auto scores = call(Dot({2, 2}, {.name = "scores"}), std::vector{a, b});
    CHECK(scores.shape() == Shape{3, 5});
    auto out = call(Dense(2, {.name = "head"}), call(Flatten(), scores));
    auto model = std::make_shared<Model>(std::vector{a, b}, std::vector{out}, "dot_model");
    model->compile({.optimizer = "sgd", .loss = "mse"});
    const std::vector<Tensor<float>> x{wave({4, 3, 4}, 1.0F), wave({4, 5, 4}, 1.0F, 2.0F)};
    const Tensor<float> y = wave({4, 2}, 0.5F, 0.3F);
    const double before = *model->evaluate(x, y, {.verbose = 0}).get("loss");
    for (int i = 0; i < 20; ++i)
      model->train_on_batch(x, y);
    CHECK(*model->evaluate(x, y, {.verbose = 0}).get("loss") < before);
    test_support::TempDir dir;
    for (const char* file : {"dot.h5", "dot.keras"}) {
      INFO(file);
      model->save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      CHECK(same_bits(loaded->predict_outputs(x)[0], model->predict_outputs(x)[0]));
    }
  }

  TEST_CASE("Dot UnitNormalization Rescaling and GroupNormalization write Keras's configs") {
    CHECK(Dot({1, 1}, {.name = "d"}).get_config() ==
          json::parse(R"({"name": "d", "trainable": true, "dtype": "float32", "axes": 1,
              "normalize": false})"));
    CHECK(Dot({1, 2}, {.normalize = true}).get_config()["axes"] == json::parse("[1, 2]"));
    CHECK(Rescaling(0.5F, {.offset = 1.0F, .name = "r"}).get_config() ==
          json::parse(R"({"name": "r", "trainable": true, "dtype": "float32", "scale": 0.5,
              "offset": 1.0})"));
    CHECK(UnitNormalization({.name = "u"}).get_config() ==
          json::parse(R"({"name": "u", "trainable": true, "dtype": "float32", "axis": -1})"));
    GroupNormalization norm({.groups = 2, .name = "g"});
    const Shape image[] = {Shape{3, 3, 4}};
    CHECK(norm.build(image, 1) == Shape{3, 3, 4});
    REQUIRE(norm.weights().size() == 2);
    CHECK(norm.weights()[0].name == "gamma");
    CHECK(norm.weights()[1].name == "beta");
    CHECK(norm.weights()[0].value.shape() == Shape{4});
    const json config = norm.get_config();
    CHECK(config["groups"] == 2);
    CHECK(config["axis"] == -1);
    CHECK(config["gamma_initializer"] == json::parse(R"({"class_name": "Ones", "config": {}})"));
    CHECK(config["beta_constraint"].is_null());
    CHECK(GroupNormalization().get_config()["groups"] == 32);
  }

  TEST_CASE("Dot UnitNormalization Rescaling and GroupNormalization name themselves in errors") {
    Dot dot({2, 2}, {.name = "d"});
    const Shape mismatched[] = {Shape{3, 4}, Shape{5, 3}};
    CHECK_THROWS_WITH_AS(dot.build(mismatched, 0),
                         "dot layer 'd': the dot axes have 4 and 3 elements in inputs of shapes "
                         "(None, 3, 4) and (None, 5, 3)",
                         ShapeError);
    Dot far({3, 1}, {.name = "d3"});
    CHECK_THROWS_WITH_AS(far.build(mismatched, 0),
                         "dot layer 'd3': axis 3 is not an axis of input 0 of shape (None, 3, 4)",
                         ShapeError);
    const Shape one[] = {Shape{4}};
    CHECK_THROWS_WITH_AS(dot.build(one, 0), "dot layer 'd': expects 2 inputs but got 1",
                         ShapeError);
    CHECK_THROWS_WITH_AS(Dot({0, 1}, {.name = "d0"}),
                         "dot layer 'd0': axes cannot hold the batch axis 0", ConfigError);
    GroupNormalization norm({.groups = 3, .name = "g"});
    const Shape four[] = {Shape{2, 4}};
    CHECK_THROWS_WITH_AS(norm.build(four, 0),
                         "group_normalization layer 'g': 3 groups must divide the 4 channels of "
                         "inputs of shape (None, 2, 4)",
                         ShapeError);
    UnitNormalization unit({.axis = {2}, .name = "u"});
    CHECK_THROWS_WITH_AS(unit.build(one, 0),
                         "unit_normalization layer 'u': axis 2 is not a distinct axis of a sample "
                         "of inputs of shape (None, 4)",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(registry.create("Dot", {{"name", "d"}}),
                         "layer 'd' (Dot): config.axes: expected a non-zero integer or a pair of "
                         "them but found nothing",
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("Rescaling", {{"name", "r"}, {"scale", {0.5, 0.25}}}),
                         "layer 'r' (Rescaling): config.scale: expected a number but found "
                         "[0.5,0.25]",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("GroupNormalization",
                        {{"name", "g"}, {"gamma_regularizer", {{"class_name", "L3"}}}}),
        doctest::Contains("layer 'g' (GroupNormalization): config.gamma_regularizer: unknown "
                          "regularizer 'L3'"),
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("GroupNormalization", {{"name", "g"}, {"groups", 0}}),
                         "layer 'g' (GroupNormalization): config.groups: expected a positive "
                         "integer but found 0",
                         ConfigError);
  }

  TEST_CASE("SpatialDropout2D drops whole channels in training and is the identity in predict") {
    CpuBackend backend;
    for (const bool first : {false, true}) {
      CAPTURE(first);
      SpatialDropout2D dropout(
          0.4, {.data_format = first ? "channels_first" : "channels_last", .name = "sd"});
      const Shape sample = first ? Shape{16, 3, 4} : Shape{3, 4, 16};
      const Shape in[] = {sample};
      dropout.build(in, 0);
      const Tensor<float> x(sample.prepend(50), 2.0F);
      Tensor<float> y(x.shape());
      const Tensor<float> inputs[] = {x};
      dropout.forward(inputs, y, {.backend = backend, .training = true, .seed = 9, .step = 3});
      std::size_t dropped = 0;
      for (std::size_t s = 0; s < 50; ++s) {
        for (std::size_t c = 0; c < 16; ++c) {
          // Every element of a channel is 0 or every one is 2 / (1 - 0.4).
          std::size_t zeros = 0;
          for (std::size_t p = 0; p < 12; ++p) {
            const float v = first ? y.data()[s * 192 + c * 12 + p] : y.data()[s * 192 + p * 16 + c];
            if (v == 0.0F) {
              ++zeros;
            } else {
              CHECK(v == doctest::Approx(2.0 / 0.6));
            }
          }
          CHECK((zeros == 0 || zeros == 12));
          dropped += zeros == 12 ? 1 : 0;
        }
      }
      // 800 channels at rate 0.4: 320 expected, 4 standard deviations (55) around it.
      CHECK(dropped > 265);
      CHECK(dropped < 375);
      dropout.forward(inputs, y, {.backend = backend, .training = false});
      CHECK(same_bits(y, x));
    }
  }

  TEST_CASE("GaussianNoise and GaussianDropout draw repeatable noise of the stated scale") {
    CpuBackend backend;
    const Tensor<float> x(Shape{400, 50}, 1.0F);
    const Tensor<float> inputs[] = {x};
    GaussianNoise noise(0.5F, {.name = "n"});
    GaussianDropout dropout(0.2, {.name = "d"});
    for (Layer* layer : std::initializer_list<Layer*>{&noise, &dropout}) {
      const Shape in[] = {Shape{50}};
      layer->build(in, 0);
      Tensor<float> y(x.shape()), again(x.shape());
      layer->forward(inputs, y, {.backend = backend, .training = true, .seed = 4, .step = 1});
      layer->forward(inputs, again, {.backend = backend, .training = true, .seed = 4, .step = 1});
      CHECK(same_bits(y, again));
      layer->forward(inputs, again, {.backend = backend, .training = true, .seed = 4, .step = 2});
      CHECK_FALSE(same_bits(y, again));
      double sum = 0.0, squares = 0.0;
      for (const float v : y) {
        sum += v;
        squares += double(v) * v;
      }
      const double mean = sum / double(y.size());
      const double stddev = std::sqrt(squares / double(y.size()) - mean * mean);
      // Both: mean 1; GaussianNoise's stddev 0.5, GaussianDropout's sqrt(0.2 / 0.8) = 0.5.
      CHECK(mean == doctest::Approx(1.0).epsilon(0.02));
      CHECK(stddev == doctest::Approx(0.5).epsilon(0.03));
      layer->forward(inputs, y, {.backend = backend, .training = false});
      CHECK(same_bits(y, x));
    }
    // GaussianDropout's gradient carries the same factor as its output.
    Tensor<float> y(x.shape()), dx(x.shape());
    const CallContext train{.backend = backend, .training = true, .seed = 4, .step = 7};
    dropout.forward(inputs, y, train);
    const Tensor<float> dxs[] = {dx};
    dropout.backward(inputs, y, x, dxs, train);
    CHECK(same_bits(dx, y));
  }

  TEST_CASE("The noise layers round-trip configs h5 and keras files and name themselves") {
    check_saved_round_trip("SpatialDropout1D", {{"rate", 0.3}}, Shape{4, 3});
    check_saved_round_trip("SpatialDropout2D", {{"rate", 0.3}, {"data_format", "channels_first"}},
                           Shape{2, 3, 3});
    check_saved_round_trip("SpatialDropout3D", {{"rate", 0.1}, {"seed", 5}}, Shape{2, 2, 2, 3});
    check_saved_round_trip("GaussianNoise", {{"stddev", 0.2}}, Shape{4});
    check_saved_round_trip("GaussianDropout", {{"rate", 0.25}, {"seed", 3}}, Shape{4});
    CHECK(GaussianNoise(0.5F, {.name = "g"}).get_config() ==
          json::parse(R"({"name": "g", "trainable": true, "dtype": "float32", "stddev": 0.5,
              "seed": null})"));
    CHECK(SpatialDropout2D(0.5, {.name = "s"}).get_config() ==
          json::parse(R"({"name": "s", "trainable": true, "dtype": "float32", "rate": 0.5,
              "data_format": "channels_last", "noise_shape": null, "seed": null})"));
    CHECK_THROWS_WITH_AS(SpatialDropout1D(1.0, {.name = "s"}),
                         "spatial_dropout1d layer 's': rate must be in [0, 1) but is 1.000000",
                         ConfigError);
    CHECK_THROWS_WITH_AS(GaussianNoise(-1.0F, {.name = "g"}),
                         "gaussian_noise layer 'g': stddev must be >= 0 but is -1.000000",
                         ConfigError);
    SpatialDropout3D three(0.5, {.name = "s3"});
    const Shape rank2[] = {Shape{4, 5}};
    CHECK_THROWS_WITH_AS(three.build(rank2, 0),
                         "spatial_dropout3d layer 's3': expects rank-4 inputs (without the batch "
                         "axis) but got (4, 5)",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(registry.create("GaussianDropout", {{"name", "d"}, {"rate", 1.5}}),
                         "layer 'd' (GaussianDropout): config.rate: expected a number in [0, 1) "
                         "but found 1.5",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("SpatialDropout1D",
                        {{"name", "s"}, {"rate", 0.5}, {"data_format", "channels_first"}}),
        "layer 's' (SpatialDropout1D): config.data_format: expected null (SpatialDropout1D has "
        "channels last) but found \"channels_first\"",
        ConfigError);
  }
}
