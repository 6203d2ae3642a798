// The convolution family of issue 34: DepthwiseConv1D/2D and SeparableConv1D/2D against PyTorch
// reference values (tests/keras/generate_conv_34.py), their configs and weights through
// model_from_config, .h5 and .keras files, training, and the errors that name the layer.

#include <doctest/doctest.h>

#include <algorithm>
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

// Named (not anonymous): the keras_layers test is a unity build.
namespace conv_34 {

const json& reference_conv_34() {
  static const json data = layer_cases::load("conv_34.json");
  return data;
}

Tensor<float> conv_wave(const Shape& shape, float scale, float phase = 0.0F) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += 0.37F;
  }
  return t;
}

bool conv_same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A model of one `class_name` layer (from `config`) on an input of `shape`, trained two steps of
/// SGD on a squared error: every weight moves, its config rebuilds the same model, and its .h5
/// and .keras files load into models with the same config, weights and predictions, bit for bit.
void check_conv_round_trip(const std::string& class_name, const json& config, const Shape& shape) {
  INFO(class_name, " ", config.dump());
  auto input = Input(shape, "in");
  auto out = call(LayerRegistry::instance().create(class_name, config), input);
  auto model = std::make_shared<Model>(std::vector{input}, std::vector{out}, "round_trip");
  const Tensor<float> x = conv_wave(shape.prepend(4), 1.5F);
  const Tensor<float> y = conv_wave(out.shape().prepend(4), 0.5F, 1.0F);
  model->compile({.optimizer = "sgd", .loss = "mse"});
  const auto initial = model->get_weights();
  const double before = *model->train_on_batch(x, y).get("loss");
  model->train_on_batch(x, y);
  CHECK(*model->train_on_batch(x, y).get("loss") < before);
  const auto trained = model->get_weights();
  REQUIRE(trained.size() == initial.size());
  for (std::size_t i = 0; i < trained.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(conv_same_bits(trained[i], initial[i]));
  }
  const json full = model_get_config(*model);
  const auto copy = model_from_config(full);
  CHECK(model_get_config(*copy) == full);
  copy->set_weights(trained);
  const Tensor<float> expected = model->predict(x, {.verbose = 0});
  CHECK(conv_same_bits(copy->predict(x, {.verbose = 0}), expected));
  test_support::TempDir dir;
  for (const char* file : {"model.h5", "model.keras"}) {
    INFO(file);
    model->save(dir / file);
    const auto loaded = load_model(dir / file);
    CHECK(model_get_config(*loaded) == full);
    const auto weights = loaded->get_weights();
    REQUIRE(weights.size() == trained.size());
    for (std::size_t i = 0; i < weights.size(); ++i)
      CHECK(conv_same_bits(weights[i], trained[i]));
    CHECK(conv_same_bits(loaded->predict(x, {.verbose = 0}), expected));
  }
}

/// The weights of a layer built from `config` on inputs of `shape`: names and shapes.
std::vector<std::pair<std::string, Shape>> conv_weight_shapes(const std::string& class_name,
                                                              const json& config,
                                                              const Shape& shape) {
  auto layer = LayerRegistry::instance().create(class_name, config);
  const Shape in[] = {shape};
  layer->build(in, 1);
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& w : layer->weights())
    out.emplace_back(w.name, w.value.shape());
  return out;
}

}  // namespace conv_34

using namespace conv_34;

TEST_SUITE("keras_layers") {
  TEST_CASE("Depthwise and separable convolutions match the PyTorch reference values") {
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : reference_conv_34()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("Depthwise and separable convolutions compute only through the backend") {
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : reference_conv_34()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Depthwise and separable convolutions keep Keras's weight layouts") {
    using W = std::vector<std::pair<std::string, Shape>>;
    CHECK(conv_weight_shapes("DepthwiseConv2D", {{"kernel_size", {3, 2}}, {"depth_multiplier", 2}},
                             Shape{6, 5, 3}) ==
          W{{"depthwise_kernel", Shape{3, 2, 3, 2}}, {"bias", Shape{6}}});
    CHECK(conv_weight_shapes(
              "DepthwiseConv2D",
              {{"kernel_size", 3}, {"use_bias", false}, {"data_format", "channels_first"}},
              Shape{4, 6, 5}) == W{{"depthwise_kernel", Shape{3, 3, 4, 1}}});
    CHECK(conv_weight_shapes("SeparableConv2D",
                             {{"filters", 5}, {"kernel_size", 3}, {"depth_multiplier", 2}},
                             Shape{6, 5, 3}) == W{{"depthwise_kernel", Shape{3, 3, 3, 2}},
                                                  {"pointwise_kernel", Shape{1, 1, 6, 5}},
                                                  {"bias", Shape{5}}});
    CHECK(conv_weight_shapes("DepthwiseConv1D", {{"kernel_size", 4}, {"depth_multiplier", 3}},
                             Shape{7, 2}) ==
          W{{"depthwise_kernel", Shape{4, 2, 3}}, {"bias", Shape{6}}});
    CHECK(conv_weight_shapes("SeparableConv1D", {{"filters", 4}, {"kernel_size", 3}},
                             Shape{7, 2}) == W{{"depthwise_kernel", Shape{3, 2, 1}},
                                               {"pointwise_kernel", Shape{1, 2, 4}},
                                               {"bias", Shape{4}}});
  }

  TEST_CASE(
      "Depthwise and separable convolutions train and round-trip configs h5 and keras files") {
    check_conv_round_trip("DepthwiseConv2D",
                          {{"kernel_size", 3}, {"padding", "same"}, {"depth_multiplier", 2}},
                          Shape{5, 5, 2});
    check_conv_round_trip("DepthwiseConv2D",
                          {{"kernel_size", 2},
                           {"strides", 2},
                           {"data_format", "channels_first"},
                           {"activation", "tanh"}},
                          Shape{3, 6, 6});
    check_conv_round_trip("SeparableConv2D",
                          {{"filters", 3}, {"kernel_size", 3}, {"depth_multiplier", 2}},
                          Shape{6, 5, 2});
    check_conv_round_trip("SeparableConv2D",
                          {{"filters", 2},
                           {"kernel_size", {2, 3}},
                           {"dilation_rate", 2},
                           {"padding", "same"},
                           {"data_format", "channels_first"}},
                          Shape{2, 6, 6});
    check_conv_round_trip("DepthwiseConv1D", {{"kernel_size", 3}, {"padding", "causal"}},
                          Shape{6, 3});
    check_conv_round_trip("SeparableConv1D",
                          {{"filters", 4}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}},
                          Shape{7, 2});
  }

  TEST_CASE("A MobileNet-style block of depthwise and separable convolutions trains") {
    set_random_seed(34);
    auto in = Input({8, 8, 3}, "image");
    auto h = call(Conv2D(4, 3, {.padding = "same", .activation = "relu"}), in);
    h = call(DepthwiseConv2D(3, {.strides = 2, .padding = "same", .use_bias = false}), h);
    h = call(BatchNormalization(), h);
    h = call(ReLU(), h);
    h = call(SeparableConv2D(6, 3, {.padding = "same", .activation = "relu"}), h);
    h = call(GlobalAveragePooling2D(), h);
    auto model = std::make_shared<Model>(in, call(Dense(2), h), "mobile_block");
    model->compile({.optimizer = "adam", .loss = "mse"});
    const Tensor<float> x = conv_wave({16, 8, 8, 3}, 1.0F);
    const Tensor<float> y = conv_wave({16, 2}, 0.5F, 0.7F);
    const double before = *model->evaluate(x, y, {.verbose = 0}).get("loss");
    model->fit(x, y, {.epochs = 10, .batch_size = 8, .verbose = 0});
    CHECK(*model->evaluate(x, y, {.verbose = 0}).get("loss") < before);
    test_support::TempDir dir;
    for (const char* file : {"mobile.h5", "mobile.keras"}) {
      INFO(file);
      model->save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      CHECK(conv_same_bits(loaded->predict(x, {.verbose = 0}), model->predict(x, {.verbose = 0})));
    }
  }

  TEST_CASE("Depthwise and separable convolutions write Keras's configs") {
    CHECK(DepthwiseConv2D(3, {.name = "dw"}).get_config() == json::parse(R"({
        "name": "dw", "trainable": true, "dtype": "float32", "depth_multiplier": 1,
        "kernel_size": [3, 3], "strides": [1, 1], "padding": "valid",
        "data_format": "channels_last", "dilation_rate": [1, 1], "activation": "linear",
        "use_bias": true,
        "depthwise_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "depthwise_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
        "depthwise_constraint": null, "bias_constraint": null})"));
    CHECK(SeparableConv2D(8, {3, 1}, {.strides = {2, 1}, .depth_multiplier = 2, .name = "sep"})
              .get_config() == json::parse(R"({
        "name": "sep", "trainable": true, "dtype": "float32", "filters": 8,
        "depth_multiplier": 2, "kernel_size": [3, 1], "strides": [2, 1], "padding": "valid",
        "data_format": "channels_last", "dilation_rate": [1, 1], "activation": "linear",
        "use_bias": true,
        "depthwise_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
        "pointwise_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "depthwise_regularizer": null, "pointwise_regularizer": null, "bias_regularizer": null,
        "activity_regularizer": null, "depthwise_constraint": null, "pointwise_constraint": null,
        "bias_constraint": null})"));
    const json dw1 = DepthwiseConv1D(5, {.padding = "causal", .dilation_rate = 2}).get_config();
    CHECK(dw1["kernel_size"] == json::parse("[5]"));
    CHECK(dw1["dilation_rate"] == json::parse("[2]"));
    CHECK(dw1["padding"] == "causal");
    CHECK(SeparableConv1D(4, 3).get_config()["filters"] == 4);
    // tf.keras 2 writes its Conv base class's groups and (SeparableConv2D) kernel_initializer,
    // and single integers where Keras 3 writes lists.
    auto& registry = LayerRegistry::instance();
    const auto tf2 =
        registry.create("SeparableConv2D",
                        json::parse(R"({"name": "s", "filters": 4, "kernel_size": 3, "strides": 1,
            "groups": 1, "depth_multiplier": 1, "kernel_initializer": {"class_name":
            "GlorotUniform", "config": {"seed": null}}, "kernel_regularizer": null,
            "kernel_constraint": null, "dtype": "float32", "activation": "relu"})"));
    CHECK(tf2->get_config()["kernel_size"] == json::parse("[3, 3]"));
    CHECK(tf2->get_config()["activation"] == "relu");
    CHECK_FALSE(tf2->get_config().contains("groups"));
  }

  TEST_CASE("Depthwise and separable convolutions name themselves in errors") {
    CHECK_THROWS_WITH_AS(DepthwiseConv2D(3, {.strides = 2, .dilation_rate = 2, .name = "dw"}),
                         "depthwise_conv2d layer 'dw': strides above 1 cannot be combined with a "
                         "dilation_rate above 1 (as in Keras)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(SeparableConv2D(0, 3, {.name = "s"}),
                         "separable_conv2d layer 's': filters, kernel_size, strides, "
                         "dilation_rate and depth_multiplier must be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(DepthwiseConv1D(3, {.depth_multiplier = 0, .name = "d1"}),
                         "depthwise_conv1d layer 'd1': filters, kernel_size, strides, "
                         "dilation_rate and depth_multiplier must be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(DepthwiseConv2D(3, {.padding = "causal", .name = "dw"}),
                         "depthwise_conv2d layer 'dw': padding must be 'valid' or 'same' but is "
                         "'causal'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(SeparableConv1D(2, 3, {.padding = "full", .name = "s1"}),
                         "separable_conv1d layer 's1': padding must be 'valid', 'same' or "
                         "'causal' but is 'full'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(DepthwiseConv2D(3, {.data_format = "nhwc", .name = "dw"}),
                         "depthwise_conv2d layer 'dw': data_format must be 'channels_last' or "
                         "'channels_first' but is 'nhwc'",
                         ConfigError);
    DepthwiseConv2D big(5, {.name = "big"});
    const Shape small[] = {Shape{4, 6, 2}};
    CHECK_THROWS_WITH_AS(big.build(small, 0),
                         "depthwise_conv2d layer 'big': a kernel of size 5x5 does not fit inputs "
                         "of shape (None, 4, 6, 2) with valid padding",
                         ShapeError);
    SeparableConv1D rank(2, 3, {.name = "r"});
    CHECK_THROWS_WITH_AS(rank.build(small, 0),
                         "separable_conv1d layer 'r': expects rank-2 inputs (without the batch "
                         "axis) but got (4, 6, 2)",
                         ShapeError);
    DepthwiseConv2D built(3, {.name = "b"});
    built.build(small, 0);
    const Shape other[] = {Shape{4, 6, 3}};
    CHECK_THROWS_WITH_AS(built.build(other, 0),
                         "depthwise_conv2d layer 'b': depthwise_kernel is (3, 3, 2, 1) but the "
                         "input has 3 channels",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create("DepthwiseConv2D",
                        {{"name", "d"}, {"kernel_size", 3}, {"depthwise_regularizer", "l2"}}),
        "layer 'd' (DepthwiseConv2D): config.depthwise_regularizer: expected null (loadstar has "
        "no regularizers or constraints) but found \"l2\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("SeparableConv2D", {{"name", "s"},
                                            {"filters", 2},
                                            {"kernel_size", 3},
                                            {"pointwise_constraint", "non_neg"}}),
        "layer 's' (SeparableConv2D): config.pointwise_constraint: expected null (loadstar has "
        "no regularizers or constraints) but found \"non_neg\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("DepthwiseConv2D", {{"name", "d"}}),
                         "layer 'd' (DepthwiseConv2D): config.kernel_size: expected a positive "
                         "integer or a list of two but found nothing",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("DepthwiseConv1D", {{"name", "d"}, {"kernel_size", 3}, {"groups", 2}}),
        "layer 'd' (DepthwiseConv1D): config.groups: expected 1 (loadstar has no grouped "
        "convolutions) but found 2",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("SeparableConv2D",
                        {{"name", "s"}, {"kernel_size", 3}, {"filters", 2}, {"padding", "causal"}}),
        "layer 's' (SeparableConv2D): config.padding: expected \"valid\" or "
        "\"same\" but found \"causal\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("DepthwiseConv2D",
                        {{"name", "d"}, {"kernel_size", 3}, {"depth_multiplier", 0}}),
        "layer 'd' (DepthwiseConv2D): config.depth_multiplier: expected a positive integer but "
        "found 0",
        ConfigError);
  }
}
