// The convolution family of issue 34: DepthwiseConv1D/2D, SeparableConv1D/2D and
// Conv1DTranspose/Conv2DTranspose, Conv1D/Conv2D with groups, Conv3D, Conv3DTranspose and the 3-D
// poolings against PyTorch
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

/// The channels `[first, first + count)` of the last axis of `t`.
Tensor<float> conv_channels(const Tensor<float>& t, std::size_t first, std::size_t count) {
  const std::size_t width = t.shape()[t.rank() - 1];
  std::vector<std::size_t> dims(t.shape().begin(), t.shape().end());
  dims.back() = count;
  Tensor<float> out{Shape(dims)};
  for (std::size_t i = 0; i < out.size() / count; ++i)
    std::copy_n(t.data() + i * width + first, count, out.data() + i * count);
  return out;
}

/// `part` checked against the channels `[first, first + part's)` of `whole`, within `tolerance`
/// of the larger magnitude (at least 1).
void check_channels(const char* what, const Tensor<float>& whole, std::size_t first,
                    const Tensor<float>& part, float tolerance = 1e-5F) {
  const Tensor<float> mine = conv_channels(whole, first, part.shape()[part.rank() - 1]);
  REQUIRE(mine.size() == part.size());
  for (std::size_t i = 0; i < part.size(); ++i) {
    const float scale = std::max({1.0F, std::abs(mine.data()[i]), std::abs(part.data()[i])});
    INFO(what, " from channel ", first, ": element ", i, " is ", mine.data()[i], ", expected ",
         part.data()[i]);
    CHECK(std::abs(mine.data()[i] - part.data()[i]) <= tolerance * scale);
  }
}

/// A model of grouped Conv2D and Conv1D layers (2, 4 and 3 groups; valid, same and causal
/// padding; channels_first with a stride), trained three steps of SGD on `backend`: the weights
/// and the predictions after them.
std::vector<Tensor<float>> trained_grouped(std::shared_ptr<Backend> backend) {
  set_random_seed(34);
  auto in = Input({9, 10, 8});
  auto h = call(Conv2D(8, 3, {.padding = "same", .groups = 2, .activation = "relu"}), in);
  h = call(
      Conv2D(12, 2,
             {.strides = 2, .data_format = "channels_first", .groups = 4, .activation = "swish"}),
      call(Permute({3, 1, 2}), h));
  h = call(Reshape({12, 20}), h);
  h = call(Conv1D(6, 3, {.padding = "causal", .groups = 2, .activation = "tanh"}), h);
  auto model = std::make_shared<Model>(in, call(Dense(2), call(Flatten(), h)), "grouped");
  model->compile({.optimizer = "sgd", .loss = "mse", .backend = std::move(backend)});
  const Tensor<float> x = conv_wave({6, 9, 10, 8}, 1.5F);
  const Tensor<float> y = conv_wave({6, 2}, 0.5F, 1.0F);
  for (int step = 0; step < 3; ++step)
    model->train_on_batch(x, y);
  auto out = model->get_weights();
  out.push_back(model->predict(x, {.verbose = 0}));
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

  TEST_CASE("Transposed convolutions keep Keras's weight layouts and output sizes") {
    using W = std::vector<std::pair<std::string, Shape>>;
    CHECK(conv_weight_shapes("Conv2DTranspose", {{"filters", 5}, {"kernel_size", {3, 2}}},
                             Shape{4, 4, 3}) ==
          W{{"kernel", Shape{3, 2, 5, 3}}, {"bias", Shape{5}}});
    CHECK(conv_weight_shapes("Conv1DTranspose",
                             {{"filters", 2}, {"kernel_size", 4}, {"use_bias", false}},
                             Shape{6, 3}) == W{{"kernel", Shape{4, 2, 3}}});
    const auto out = [](const std::string& class_name, const json& config, const Shape& shape) {
      auto layer = LayerRegistry::instance().create(class_name, config);
      const Shape in[] = {shape};
      return layer->build(in, 1);
    };
    // Keras's deconv_output_length: same -> in * stride; valid -> in * stride + max(k - s, 0);
    // with output_padding: (in - 1) * stride + k - 2 * pad + output_padding.
    CHECK(out("Conv2DTranspose",
              {{"filters", 4}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}},
              Shape{5, 7, 2}) == Shape{10, 14, 4});
    CHECK(out("Conv2DTranspose", {{"filters", 4}, {"kernel_size", 3}, {"strides", 2}},
              Shape{5, 7, 2}) == Shape{11, 15, 4});
    CHECK(out("Conv2DTranspose", {{"filters", 4}, {"kernel_size", {2, 1}}, {"strides", 3}},
              Shape{5, 7, 2}) == Shape{15, 21, 4});
    CHECK(out("Conv2DTranspose",
              {{"filters", 1},
               {"kernel_size", 3},
               {"strides", 2},
               {"output_padding", {1, 0}},
               {"data_format", "channels_first"}},
              Shape{2, 5, 7}) == Shape{1, 12, 15});
    CHECK(out("Conv1DTranspose", {{"filters", 3}, {"kernel_size", 3}, {"dilation_rate", 2}},
              Shape{6, 2}) == Shape{10, 3});
  }

  TEST_CASE("Transposed convolutions train and round-trip configs h5 and keras files") {
    check_conv_round_trip("Conv2DTranspose",
                          {{"filters", 3}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}},
                          Shape{3, 4, 2});
    check_conv_round_trip("Conv2DTranspose",
                          {{"filters", 2},
                           {"kernel_size", {2, 3}},
                           {"strides", 2},
                           {"output_padding", 1},
                           {"data_format", "channels_first"},
                           {"activation", "tanh"}},
                          Shape{2, 3, 3});
    check_conv_round_trip("Conv1DTranspose",
                          {{"filters", 2}, {"kernel_size", 3}, {"dilation_rate", 2}}, Shape{5, 3});
  }

  TEST_CASE("A U-Net-style model upsamples with Conv2DTranspose and trains") {
    set_random_seed(36);
    auto in = Input({8, 8, 2}, "image");
    auto down = call(Conv2D(4, 3, {.strides = 2, .padding = "same", .activation = "relu"}), in);
    auto up =
        call(Conv2DTranspose(4, 3, {.strides = 2, .padding = "same", .activation = "relu"}), down);
    auto joined = call(Concatenate(), std::vector{up, in});
    auto model = std::make_shared<Model>(in, call(Conv2D(1, 1), joined), "u_net");
    CHECK(up.shape() == Shape{8, 8, 4});
    model->compile({.optimizer = "adam", .loss = "mse"});
    const Tensor<float> x = conv_wave({8, 8, 8, 2}, 1.0F);
    const Tensor<float> y = conv_wave({8, 8, 8, 1}, 0.5F, 0.4F);
    const double before = *model->evaluate(x, y, {.verbose = 0}).get("loss");
    model->fit(x, y, {.epochs = 10, .batch_size = 4, .verbose = 0});
    CHECK(*model->evaluate(x, y, {.verbose = 0}).get("loss") < before);
  }

  TEST_CASE("Transposed convolutions write Keras's configs") {
    CHECK(Conv2DTranspose(8, 3, {.strides = 2, .name = "up"}).get_config() == json::parse(R"({
        "name": "up", "trainable": true, "dtype": "float32", "filters": 8,
        "kernel_size": [3, 3], "strides": [2, 2], "padding": "valid", "output_padding": null,
        "data_format": "channels_last", "dilation_rate": [1, 1], "activation": "linear",
        "use_bias": true,
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
        "kernel_constraint": null, "bias_constraint": null})"));
    CHECK(Conv2DTranspose(8, 3, {.strides = 2, .output_padding = Size2(1, 0)})
              .get_config()["output_padding"] == json::parse("[1, 0]"));
    CHECK(
        Conv1DTranspose(2, 3, {.strides = 2, .output_padding = 1}).get_config()["output_padding"] ==
        json::parse("[1]"));
    auto& registry = LayerRegistry::instance();
    // tf.keras 2 writes its Conv base class's groups.
    const auto tf2 = registry.create(
        "Conv2DTranspose", json::parse(R"({"name": "t", "filters": 4, "kernel_size": [3, 3],
            "strides": [2, 2], "groups": 1, "output_padding": [1, 1], "padding": "same"})"));
    CHECK(tf2->get_config()["output_padding"] == json::parse("[1, 1]"));
    CHECK(registry.create("Conv1DTranspose", {{"filters", 1}, {"kernel_size", 2}})
              ->get_config()["output_padding"]
              .is_null());
  }

  TEST_CASE("Transposed convolutions name themselves in errors") {
    CHECK_THROWS_WITH_AS(
        Conv2DTranspose(2, 3, {.strides = 2, .output_padding = Size2(2, 1), .name = "t"}),
        "conv2d_transpose layer 't': output_padding must be below the strides "
        "but is 2 for a stride of 2",
        ConfigError);
    CHECK_THROWS_WITH_AS(Conv1DTranspose(2, 3, {.strides = 2, .dilation_rate = 2, .name = "t1"}),
                         "conv1d_transpose layer 't1': strides above 1 cannot be combined with a "
                         "dilation_rate above 1 (as in Keras)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Conv2DTranspose(0, 3, {.name = "t"}),
                         "conv2d_transpose layer 't': filters, kernel_size, strides and "
                         "dilation_rate must be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Conv1DTranspose(2, 3, {.padding = "causal", .name = "t1"}),
                         "conv1d_transpose layer 't1': padding must be 'valid' or 'same' but is "
                         "'causal'",
                         ConfigError);
    Conv2DTranspose built(2, 3, {.name = "b"});
    const Shape in[] = {Shape{4, 4, 3}};
    built.build(in, 0);
    const Shape other[] = {Shape{4, 4, 2}};
    CHECK_THROWS_WITH_AS(built.build(other, 0),
                         "conv2d_transpose layer 'b': kernel is (3, 3, 2, 3) but the input has 2 "
                         "channels",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create(
            "Conv2DTranspose",
            {{"name", "t"}, {"filters", 2}, {"kernel_size", 3}, {"output_padding", {1, 2, 3}}}),
        "layer 't' (Conv2DTranspose): config.output_padding: expected null, a "
        "non-negative integer or a list of two but found [1,2,3]",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("Conv1DTranspose",
                        {{"name", "t"}, {"filters", 2}, {"kernel_size", 3}, {"groups", 2}}),
        "layer 't' (Conv1DTranspose): config.groups: expected 1 (loadstar has no grouped "
        "convolutions) but found 2",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create(
            "Conv2DTranspose",
            {{"name", "t"}, {"filters", 2}, {"kernel_size", 3}, {"kernel_regularizer", "l3"}}),
        doctest::Contains(
            "layer 't' (Conv2DTranspose): config.kernel_regularizer: unknown regularizer 'l3'"),
        ConfigError);
  }

  TEST_CASE("Conv1D and Conv2D with groups keep Keras's kernel layout and round-trip") {
    using W = std::vector<std::pair<std::string, Shape>>;
    CHECK(conv_weight_shapes("Conv2D", {{"filters", 6}, {"kernel_size", 3}, {"groups", 3}},
                             Shape{5, 5, 9}) ==
          W{{"kernel", Shape{3, 3, 3, 6}}, {"bias", Shape{6}}});
    CHECK(conv_weight_shapes("Conv1D", {{"filters", 4}, {"kernel_size", 2}, {"groups", 2}},
                             Shape{5, 2}) == W{{"kernel", Shape{2, 1, 4}}, {"bias", Shape{4}}});
    CHECK(Conv2D(4, 3, {.groups = 2}).get_config()["groups"] == 2);
    CHECK(LayerRegistry::instance()
              .create("Conv1D", {{"filters", 4}, {"kernel_size", 3}, {"groups", 4}})
              ->get_config()["groups"] == 4);
    check_conv_round_trip("Conv2D", {{"filters", 4}, {"kernel_size", 3}, {"groups", 2}},
                          Shape{5, 5, 4});
    check_conv_round_trip(
        "Conv1D",
        {{"filters", 6}, {"kernel_size", 2}, {"groups", 3}, {"data_format", "channels_first"}},
        Shape{3, 5});
  }

  TEST_CASE("CpuBackend grouped_conv2d_forward and backward convolve each group on its own") {
    // 3 groups of 4 input channels and 3 filters, several tiles of images: for any thread count,
    // each group's output, kernel and bias gradients and input gradient are those of an ordinary
    // convolution of the group's channels alone, written or added to what was there.
    const std::size_t groups = 3, per_in = 4, per_out = 3, filters = groups * per_out;
    const Conv2DGeometry g{.batch = 5,
                           .in_h = 9,
                           .in_w = 8,
                           .in_c = groups * per_in,
                           .out_h = 9,
                           .out_w = 8,
                           .out_c = filters,
                           .kernel_h = 3,
                           .kernel_w = 3,
                           .pad_top = 1,
                           .pad_left = 1};
    const std::size_t rows = g.batch * g.out_h * g.out_w, taps = g.kernel_h * g.kernel_w;
    const Tensor<float> x = conv_wave({g.batch, g.in_h, g.in_w, g.in_c}, 1.5F);
    const Tensor<float> kernel = conv_wave({taps * per_in, filters}, 0.4F, 0.3F);
    const Tensor<float> bias = conv_wave({filters}, 0.5F, 0.8F);
    const Tensor<float> dy = conv_wave({rows, filters}, 0.7F, 1.1F);
    const Tensor<float> before = conv_wave({taps * per_in, filters}, 0.2F, 2.0F);
    const Tensor<float> bias_before = conv_wave({filters}, 0.2F, 2.5F);
    Conv2DGeometry group = g;
    group.in_c = per_in;
    group.out_c = per_out;
    CpuBackend one(1);
    for (std::size_t threads : {1, 2, 3}) {
      CAPTURE(threads);
      CpuBackend backend(threads);
      const Tensor<float> y({rows, filters});
      REQUIRE(backend.grouped_conv2d_forward(x, g, groups, kernel, bias,
                                             loadstar::keras::Activation::swish, y));
      for (const bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        const Tensor<float> dkernel = before.clone(), dbias = bias_before.clone();
        const Tensor<float> dx(x.shape());
        REQUIRE(backend.grouped_conv2d_backward(x, g, groups, kernel, bias,
                                                loadstar::keras::Activation::swish, y, dy, dkernel,
                                                dbias, dx, accumulate));
        for (std::size_t k = 0; k < groups; ++k) {
          CAPTURE(k);
          const Tensor<float> xk = conv_channels(x, k * per_in, per_in);
          const Tensor<float> kernel_k = conv_channels(kernel, k * per_out, per_out);
          const Tensor<float> bias_k = conv_channels(bias, k * per_out, per_out);
          const Tensor<float> yk({rows, per_out});
          one.conv2d_forward(xk, group, kernel_k, bias_k, loadstar::keras::Activation::swish, yk);
          check_channels("output", y, k * per_out, yk);
          const Tensor<float> dkernel_k = conv_channels(before, k * per_out, per_out);
          const Tensor<float> dbias_k = conv_channels(bias_before, k * per_out, per_out);
          const Tensor<float> dxk(xk.shape());
          one.conv2d_backward(xk, group, kernel_k, bias_k, loadstar::keras::Activation::swish, yk,
                              conv_channels(dy, k * per_out, per_out), dkernel_k, dbias_k, dxk,
                              accumulate);
          check_channels("kernel gradient", dkernel, k * per_out, dkernel_k);
          check_channels("bias gradient", dbias, k * per_out, dbias_k);
          check_channels("input gradient", dx, k * per_in, dxk);
        }
      }
    }
    // A softmax's gradient mixes the groups: left to the layer's per-group path.
    const Tensor<float> dkernel(kernel.shape()), dbias({filters}), dx(x.shape());
    CHECK_FALSE(one.grouped_conv2d_backward(
        x, g, groups, kernel, bias, loadstar::keras::Activation::softmax,
        Tensor<float>({rows, filters}), dy, dkernel, dbias, dx, false));
  }

  TEST_CASE("Conv1D and Conv2D with groups train alike on any thread count and group by group") {
    // The CPU backend's grouped kernels on 1 to 3 threads, and the layers' per-group path
    // (permute and a convolution per group, what a backend without grouped kernels runs).
    const auto one = trained_grouped(cpu_backend(1));
    std::vector<std::shared_ptr<Backend>> others{
        cpu_backend(2), cpu_backend(3), std::make_shared<loadstar::test::ProtectedBackend>(2)};
    for (std::size_t b = 0; b < others.size(); ++b) {
      CAPTURE(b);
      const auto other = trained_grouped(others[b]);
      REQUIRE(other.size() == one.size());
      for (std::size_t i = 0; i < one.size(); ++i) {
        CAPTURE(i);
        REQUIRE(other[i].shape() == one[i].shape());
        for (std::size_t j = 0; j < one[i].size(); ++j) {
          INFO("element ", j, " is ", other[i].data()[j], ", expected ", one[i].data()[j]);
          CHECK(other[i].data()[j] == doctest::Approx(one[i].data()[j]).epsilon(1e-4));
        }
      }
    }
  }

  TEST_CASE("Conv1D and Conv2D with groups name themselves in errors") {
    CHECK_THROWS_WITH_AS(Conv2D(5, 3, {.groups = 2, .name = "c"}),
                         "conv2d layer 'c': groups must be positive and divide the 5 filters but "
                         "is 2",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Conv1D(4, 3, {.groups = 0, .name = "c1"}),
                         "conv1d layer 'c1': groups must be positive and divide the 4 filters but "
                         "is 0",
                         ConfigError);
    Conv2D conv(4, 3, {.groups = 2, .name = "c"});
    const Shape odd[] = {Shape{5, 5, 3}};
    CHECK_THROWS_WITH_AS(conv.build(odd, 0),
                         "conv2d layer 'c': 2 groups must divide the input's 3 channels",
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        LayerRegistry::instance().create(
            "Conv1D", {{"name", "c"}, {"filters", 4}, {"kernel_size", 3}, {"groups", 0}}),
        "layer 'c' (Conv1D): config.groups: expected a positive integer but found 0", ConfigError);
  }

  TEST_CASE("GlobalAveragePooling3D and GlobalMaxPooling3D write Keras's configs and round-trip") {
    CHECK(GlobalAveragePooling3D({.name = "g"}).get_config() ==
          json::parse(R"({"name": "g", "trainable": true, "dtype": "float32",
              "data_format": "channels_last", "keepdims": false})"));
    GlobalMaxPooling3D pool({.data_format = "channels_first", .keepdims = true, .name = "m"});
    const Shape volume[] = {Shape{3, 2, 4, 5}};
    CHECK(pool.build(volume, 0) == Shape{3, 1, 1, 1});
    CHECK(LayerRegistry::instance()
              .create("GlobalAveragePooling3D", {{"keepdims", true}})
              ->get_config()["keepdims"] == true);
    auto in = Input({2, 3, 2, 2}, "volume");
    auto model = std::make_shared<Model>(
        in, call(Dense(2), call(GlobalMaxPooling3D({.name = "gmp"}), in)), "pooled");
    model->compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> x = conv_wave({4, 2, 3, 2, 2}, 1.0F);
    model->train_on_batch(x, conv_wave({4, 2}, 0.5F));
    test_support::TempDir dir;
    for (const char* file : {"pooled.h5", "pooled.keras"}) {
      INFO(file);
      model->save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      CHECK(conv_same_bits(loaded->predict(x, {.verbose = 0}), model->predict(x, {.verbose = 0})));
    }
    const Shape flat[] = {Shape{3, 4}};
    CHECK_THROWS_WITH_AS(pool.build(flat, 0),
                         "global_max_pooling3d layer 'm': expects rank-4 inputs (without the "
                         "batch axis) but got (3, 4)",
                         ShapeError);
  }

  TEST_CASE("MaxPooling3D and AveragePooling3D write Keras's configs train and round-trip") {
    CHECK(MaxPooling3D({.name = "p"}).get_config() ==
          json::parse(R"({"name": "p", "trainable": true, "dtype": "float32",
              "pool_size": [2, 2, 2], "strides": [2, 2, 2], "padding": "valid",
              "data_format": "channels_last"})"));
    auto& registry = LayerRegistry::instance();
    const auto average = registry.create(
        "AveragePooling3D", {{"pool_size", 3}, {"strides", {1, 2, 1}}, {"padding", "same"}});
    CHECK(average->get_config()["pool_size"] == json::parse("[3, 3, 3]"));
    CHECK(average->get_config()["strides"] == json::parse("[1, 2, 1]"));
    const Shape volume[] = {Shape{4, 5, 3, 2}};
    CHECK(average->build(volume, 0) == Shape{4, 3, 3, 2});
    auto in = Input({4, 4, 4, 2}, "volume");
    auto h = call(MaxPooling3D({.pool_size = {2, 2, 1}}), in);
    h = call(AveragePooling3D(
                 {.pool_size = {1, 2, 2}, .padding = "same", .data_format = "channels_first"}),
             h);
    auto model = std::make_shared<Model>(in, call(Dense(2), call(Flatten(), h)), "pooled3d");
    model->compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor<float> x = conv_wave({4, 4, 4, 4, 2}, 1.0F);
    const Tensor<float> y = conv_wave({4, 2}, 0.5F, 0.2F);
    const double before = *model->evaluate(x, y, {.verbose = 0}).get("loss");
    for (int i = 0; i < 5; ++i)
      model->train_on_batch(x, y);
    CHECK(*model->evaluate(x, y, {.verbose = 0}).get("loss") < before);
    test_support::TempDir dir;
    for (const char* file : {"pooled3d.h5", "pooled3d.keras"}) {
      INFO(file);
      model->save(dir / file);
      const auto loaded = load_model(dir / file);
      CHECK(model_get_config(*loaded) == model_get_config(*model));
      CHECK(conv_same_bits(loaded->predict(x, {.verbose = 0}), model->predict(x, {.verbose = 0})));
    }
  }

  TEST_CASE("MaxPooling3D and AveragePooling3D name themselves in errors") {
    CHECK_THROWS_WITH_AS(MaxPooling3D({.pool_size = {2, 0, 2}, .name = "p"}),
                         "max_pooling3d layer 'p': pool_size and strides must be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(AveragePooling3D({.padding = "full", .name = "a"}),
                         "average_pooling3d layer 'a': padding must be 'valid' or 'same' but is "
                         "'full'",
                         ConfigError);
    MaxPooling3D big({.pool_size = {3, 3, 3}, .name = "big"});
    const Shape small[] = {Shape{2, 4, 4, 1}};
    CHECK_THROWS_WITH_AS(big.build(small, 0),
                         "max_pooling3d layer 'big': a 3x3x3 pool does not fit inputs of shape "
                         "(None, 2, 4, 4, 1) with valid padding",
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        LayerRegistry::instance().create("AveragePooling3D",
                                         {{"name", "a"}, {"pool_size", {2, 2}}}),
        "layer 'a' (AveragePooling3D): config.pool_size: expected a positive integer or a list of "
        "three but found [2,2]",
        ConfigError);
  }

  TEST_CASE("Conv3D and Conv3DTranspose keep Keras's layouts configs and round-trip") {
    using W = std::vector<std::pair<std::string, Shape>>;
    CHECK(conv_weight_shapes("Conv3D", {{"filters", 4}, {"kernel_size", {3, 2, 1}}},
                             Shape{5, 5, 5, 2}) ==
          W{{"kernel", Shape{3, 2, 1, 2, 4}}, {"bias", Shape{4}}});
    CHECK(conv_weight_shapes("Conv3DTranspose", {{"filters", 4}, {"kernel_size", 2}},
                             Shape{3, 3, 3, 2}) ==
          W{{"kernel", Shape{2, 2, 2, 4, 2}}, {"bias", Shape{4}}});
    CHECK(Conv3D(2, {3, 3, 3}, {.name = "c"}).get_config() == json::parse(R"({
        "name": "c", "trainable": true, "dtype": "float32", "filters": 2,
        "kernel_size": [3, 3, 3], "strides": [1, 1, 1], "padding": "valid",
        "data_format": "channels_last", "dilation_rate": [1, 1, 1], "groups": 1,
        "activation": "linear", "use_bias": true,
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
        "kernel_constraint": null, "bias_constraint": null})"));
    const json transposed =
        Conv3DTranspose(2, {2, 2, 2}, {.strides = {2, 2, 2}, .output_padding = Size3{1, 0, 1}})
            .get_config();
    CHECK(transposed["output_padding"] == json::parse("[1, 0, 1]"));
    CHECK_FALSE(transposed.contains("groups"));
    check_conv_round_trip("Conv3D", {{"filters", 2}, {"kernel_size", 2}, {"padding", "same"}},
                          Shape{3, 4, 3, 2});
    check_conv_round_trip("Conv3DTranspose",
                          {{"filters", 2},
                           {"kernel_size", {2, 3, 2}},
                           {"strides", 2},
                           {"data_format", "channels_first"},
                           {"activation", "tanh"}},
                          Shape{2, 2, 2, 3});
  }

  TEST_CASE("Conv3D and Conv3DTranspose name themselves in errors") {
    CHECK_THROWS_WITH_AS(Conv3D(0, {2, 2, 2}, {.name = "c"}),
                         "conv3d layer 'c': filters, kernel_size, strides and dilation_rate must "
                         "be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        Conv3DTranspose(2, {2, 2, 2},
                        {.strides = {1, 2, 1}, .output_padding = Size3{0, 2, 0}, .name = "t"}),
        "conv3d_transpose layer 't': output_padding must be below the strides "
        "but is 2 for a stride of 2",
        ConfigError);
    Conv3D big(2, {3, 3, 3}, {.name = "big"});
    const Shape small[] = {Shape{2, 4, 4, 1}};
    CHECK_THROWS_WITH_AS(big.build(small, 0),
                         "conv3d layer 'big': a 3x3x3 kernel does not fit inputs of shape (None, "
                         "2, 4, 4, 1) with valid padding",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create("Conv3D",
                        {{"name", "c"}, {"filters", 4}, {"kernel_size", 3}, {"groups", 2}}),
        "layer 'c' (Conv3D): config.groups: expected 1 (loadstar has no grouped "
        "3-D convolutions) but found 2",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("Conv3DTranspose",
                        {{"name", "t"}, {"filters", 4}, {"kernel_size", {3, 3}}}),
        "layer 't' (Conv3DTranspose): config.kernel_size: expected a positive integer or a list "
        "of three but found [3,3]",
        ConfigError);
  }
}
