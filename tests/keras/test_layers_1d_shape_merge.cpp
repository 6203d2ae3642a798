// The 1-D convolution and pooling layers, the channels_first data format, and the shape, merge
// and normalisation layers: PyTorch reference values
// (tests/keras/generate_layers_1d_shape_merge.py), config round trips through model_from_config,
// and the errors that name the layer.

#include <doctest/doctest.h>

#include <H5Cpp.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/keras/saving/model_config.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/protected_backend.hpp"

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using nlohmann::json;

namespace {

const json& merge_reference() {
  static const json data = layer_cases::load("layers_1d_shape_merge.json");
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

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A model of `class_name` (built from `config`) on inputs of `shapes`: its config builds a model
/// with the same config, which with the same weights predicts bitwise the same.
void check_model_round_trip(const std::string& class_name, const json& config,
                            const std::vector<Shape>& shapes) {
  INFO(class_name, " ", config.dump());
  std::vector<KerasTensor> inputs;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    inputs.push_back(Input(shapes[i], "in" + std::to_string(i)));
  auto out = call(LayerRegistry::instance().create(class_name, config), inputs);
  Model model(inputs, {out}, "round_trip");
  std::vector<Tensor<float>> weights = model.get_weights();
  for (std::size_t i = 0; i < weights.size(); ++i)
    weights[i] = ramp(weights[i].shape(), 0.5F, float(i));
  model.set_weights(weights);
  const json full = model_get_config(model);
  const auto copy = model_from_config(full);
  CHECK(model_get_config(*copy) == full);
  copy->set_weights(model.get_weights());
  std::vector<Tensor<float>> x;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    x.push_back(ramp(shapes[i].prepend(3), 1.5F, float(i)));
  const auto expected = model.predict_outputs(x);
  const auto actual = copy->predict_outputs(x);
  REQUIRE(expected.size() == 1);
  REQUIRE(actual.size() == 1);
  CHECK(bitwise_equal(expected[0], actual[0]));
}

/// The weights of a Keras 2 HDF5 file for `model`, read from
/// `/model_weights/<layer>/<layer>/<weight>:0` in the order of `model.get_weights()`.
std::vector<Tensor<float>> keras_file_weights(const std::filesystem::path& path,
                                              const Model& model) {
  H5::H5File file(path.string(), H5F_ACC_RDONLY);
  std::vector<Tensor<float>> weights;
  for (const auto& layer : model.layers()) {
    for (const auto& w : layer->weights()) {
      Tensor<float> value(w.value.shape());
      const std::string dataset =
          "/model_weights/" + layer->name() + "/" + layer->name() + "/" + w.name + ":0";
      INFO(dataset);
      file.openDataSet(dataset).read(value.data(), H5::PredType::NATIVE_FLOAT);
      weights.push_back(value);
    }
  }
  return weights;
}

std::string h5_string_attribute(const std::filesystem::path& path, const char* name) {
  H5::H5File file(path.string(), H5F_ACC_RDONLY);
  H5::Attribute attribute = file.openAttribute(name);
  std::string value;
  attribute.read(attribute.getStrType(), value);
  return value;
}

}  // namespace

TEST_SUITE("keras_layers") {
  TEST_CASE("More layers match the PyTorch reference values with one and three threads") {
    for (std::size_t threads : {1, 3}) {
      CpuBackend backend(threads);
      for (const auto& c : merge_reference()["cases"])
        layer_cases::run_case(c, backend);
    }
  }

  TEST_CASE("More layers compute only through the backend") {
    loadstar::test::ProtectedBackend backend(2);
    for (const auto& c : merge_reference()["cases"])
      layer_cases::run_case(c, backend);
  }

  TEST_CASE("Conv1D and the 1-D pooling layers round-trip their configs through a model") {
    check_model_round_trip("Conv1D",
                           {{"filters", 3},
                            {"kernel_size", {3}},
                            {"padding", "causal"},
                            {"dilation_rate", {2}},
                            {"activation", "relu"}},
                           {Shape{9, 2}});
    check_model_round_trip("Conv1D",
                           {{"filters", 2},
                            {"kernel_size", 2},
                            {"strides", 2},
                            {"data_format", "channels_first"},
                            {"use_bias", false}},
                           {Shape{3, 8}});
    check_model_round_trip("MaxPooling1D", {{"pool_size", {3}}, {"padding", "same"}},
                           {Shape{7, 2}});
    check_model_round_trip("AveragePooling1D",
                           {{"pool_size", 2}, {"strides", 1}, {"data_format", "channels_first"}},
                           {Shape{2, 6}});
    check_model_round_trip("GlobalAveragePooling1D", json::object(), {Shape{5, 3}});
    check_model_round_trip("GlobalMaxPooling1D", {{"keepdims", true}}, {Shape{5, 3}});
    check_model_round_trip("Conv2D",
                           {{"filters", 2},
                            {"kernel_size", {3, 2}},
                            {"padding", "same"},
                            {"data_format", "channels_first"}},
                           {Shape{3, 5, 4}});
    check_model_round_trip("MaxPooling2D", {{"data_format", "channels_first"}}, {Shape{2, 4, 6}});
    check_model_round_trip("AveragePooling2D",
                           {{"pool_size", {3, 3}},
                            {"strides", {1, 1}},
                            {"padding", "same"},
                            {"data_format", "channels_first"}},
                           {Shape{2, 4, 4}});
    check_model_round_trip("GlobalAveragePooling2D",
                           {{"data_format", "channels_first"}, {"keepdims", true}},
                           {Shape{3, 2, 2}});
    check_model_round_trip("GlobalMaxPooling2D", {{"data_format", "channels_first"}},
                           {Shape{3, 2, 2}});
    check_model_round_trip("Flatten", {{"data_format", "channels_first"}}, {Shape{3, 2, 2}});
  }

  TEST_CASE("Conv1D and the pooling layers write Keras 2's configs") {
    const json conv = Conv1D(4, 3, {.padding = "causal", .name = "c"}).get_config();
    CHECK(conv["kernel_size"] == json::parse("[3]"));
    CHECK(conv["strides"] == json::parse("[1]"));
    CHECK(conv["dilation_rate"] == json::parse("[1]"));
    CHECK(conv["padding"] == "causal");
    CHECK(conv["data_format"] == "channels_last");
    CHECK(conv["groups"] == 1);
    const json pool = MaxPooling1D({.pool_size = 5, .name = "p"}).get_config();
    CHECK(pool == json::parse(R"({"name": "p", "trainable": true, "dtype": "float32",
        "pool_size": [5], "strides": [5], "padding": "valid", "data_format": "channels_last"})"));
    CHECK(GlobalMaxPooling1D({.name = "g"}).get_config() ==
          json::parse(R"({"name": "g", "trainable": true, "dtype": "float32",
              "data_format": "channels_last", "keepdims": false})"));
    Conv1D with_weights(4, 3, {.name = "k"});
    const Shape in[] = {Shape{10, 2}};
    CHECK(with_weights.build(in, 1) == Shape{8, 4});
    REQUIRE(with_weights.weights().size() == 2);
    CHECK(with_weights.weights()[0].value.shape() == Shape{3, 2, 4});
    Conv2D planar(5, {3, 2}, {.data_format = "channels_first", .name = "p"});
    const Shape image[] = {Shape{2, 7, 6}};
    CHECK(planar.build(image, 1) == Shape{5, 5, 5});
    CHECK(planar.weights()[0].value.shape() == Shape{3, 2, 2, 5});
  }

  TEST_CASE("Conv1D and the pooling layers name themselves in shape and argument errors") {
    Conv1D conv(2, 3, {.name = "c1"});
    const Shape image[] = {Shape{4, 4, 1}};
    CHECK_THROWS_WITH_AS(conv.build(image, 0),
                         "conv1d layer 'c1': expects rank-2 inputs (without the batch axis) but "
                         "got (4, 4, 1)",
                         ShapeError);
    const Shape short_sequence[] = {Shape{2, 3}};
    CHECK_THROWS_WITH_AS(conv.build(short_sequence, 0),
                         "conv1d layer 'c1': a kernel of size 3 does not fit inputs of shape "
                         "(2, 3) with valid padding",
                         ShapeError);
    const Shape ok[] = {Shape{6, 3}};
    conv.build(ok, 0);
    const Shape other_channels[] = {Shape{6, 4}};
    CHECK_THROWS_WITH_AS(conv.build(other_channels, 0),
                         "conv1d layer 'c1': kernel is (3, 3, 2) but the input has 4 channels",
                         ShapeError);
    CHECK_THROWS_WITH_AS(Conv1D(2, 3, {.padding = "full", .name = "c2"}),
                         "conv1d layer 'c2': padding must be 'valid', 'same' or 'causal' but is "
                         "'full'",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Conv1D(2, 0, {.name = "c3"}),
                         "conv1d layer 'c3': filters, kernel_size, strides and dilation_rate must "
                         "be positive",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Conv2D(2, 3, {.data_format = "nchw", .name = "c4"}),
                         "conv2d layer 'c4': data_format must be 'channels_last' or "
                         "'channels_first' but is 'nchw'",
                         ConfigError);
    MaxPooling1D pool({.pool_size = 4, .name = "p1"});
    const Shape three[] = {Shape{3, 2}};
    CHECK_THROWS_WITH_AS(pool.build(three, 0),
                         "max_pooling1d layer 'p1': a pool of size 4 does not fit inputs of shape "
                         "(3, 2) with valid padding",
                         ShapeError);
    GlobalAveragePooling1D gap({.name = "g1"});
    CHECK_THROWS_WITH_AS(gap.build(image, 0),
                         "global_average_pooling1d layer 'g1': expects rank-2 inputs (without the "
                         "batch axis) but got (4, 4, 1)",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(
        registry.create("Conv1D", {{"name", "c"}, {"filters", 2}, {"kernel_size", {3, 3}}}),
        "layer 'c' (Conv1D): config.kernel_size: expected a positive integer or a list of one but "
        "found [3,3]",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("Conv1D",
                        {{"name", "c"}, {"filters", 2}, {"kernel_size", 3}, {"padding", "full"}}),
        "layer 'c' (Conv1D): config.padding: expected \"valid\", \"same\" or \"causal\" but found "
        "\"full\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("MaxPooling1D", {{"name", "p"}, {"data_format", "channels_middle"}}),
        "layer 'p' (MaxPooling1D): config.data_format: expected \"channels_last\" or "
        "\"channels_first\" but found \"channels_middle\"",
        ConfigError);
  }

  TEST_CASE("Embedding feeds Conv1D MaxPooling1D and Flatten as in tf.keras issue 9349") {
    auto tokens = Input({6}, "input_1");
    auto x = call(Embedding(5, 3, {.name = "embedding"}), tokens);
    x = call(Conv1D(3, 2, {.activation = "relu", .name = "conv1d"}), x);
    x = call(MaxPooling1D({.pool_size = 5, .name = "max_pooling1d"}), x);
    x = call(Flatten(), x);
    auto y = call(Dense(2, {.activation = "softmax", .name = "dense"}), x);
    Model model({tokens}, {y}, "issue_9349");
    CHECK(y.shape() == Shape{2});
    model.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
    const Tensor<float> ids(
        {4, 6}, {0, 1, 2, 3, 4, 0, 4, 4, 3, 2, 1, 0, 1, 1, 1, 1, 1, 1, 2, 3, 2, 3, 2, 3});
    const Tensor<float> labels({4}, {0, 1, 0, 1});
    const double before = *model.evaluate(ids, labels, {.verbose = 0}).get("loss");
    for (int i = 0; i < 30; ++i)
      model.train_on_batch(ids, labels);
    CHECK(*model.evaluate(ids, labels, {.verbose = 0}).get("loss") < before);
  }

  TEST_CASE("The shape merge and normalisation layers round-trip their configs through a model") {
    check_model_round_trip("LayerNormalization", json::object(), {Shape{6}});
    check_model_round_trip("LayerNormalization",
                           {{"axis", {1, 2}}, {"epsilon", 0.01}, {"center", false}}, {Shape{3, 4}});
    check_model_round_trip("ZeroPadding2D", {{"padding", {{0, 1}, {2, 1}}}}, {Shape{3, 2, 2}});
    check_model_round_trip("ZeroPadding2D", {{"padding", 2}, {"data_format", "channels_first"}},
                           {Shape{2, 3, 2}});
    check_model_round_trip("UpSampling2D", {{"size", {2, 3}}}, {Shape{2, 2, 3}});
    check_model_round_trip(
        "UpSampling2D",
        {{"size", 2}, {"interpolation", "bilinear"}, {"data_format", "channels_first"}},
        {Shape{2, 3, 3}});
    for (const char* merge : {"Multiply", "Average", "Maximum", "Minimum"})
      check_model_round_trip(merge, json::object(), {Shape{4}, Shape{4}, Shape{4}});
    check_model_round_trip("Subtract", json::object(), {Shape{2, 3}, Shape{2, 3}});
    check_model_round_trip("Multiply", json::object(), {Shape{2, 3}, Shape{2, 1}, Shape{3}});
    check_model_round_trip("Permute", {{"dims", {3, 1, 2}}}, {Shape{2, 3, 4}});
    check_model_round_trip("RepeatVector", {{"n", 4}}, {Shape{5}});
  }

  TEST_CASE("The shape merge and normalisation layers write Keras 2's configs and weights") {
    LayerNormalization norm({.axis = {1, 2}, .name = "ln"});
    const Shape in[] = {Shape{3, 4, 5}};
    CHECK(norm.build(in, 1) == Shape{3, 4, 5});
    REQUIRE(norm.weights().size() == 2);
    CHECK(norm.weights()[0].name == "gamma");
    CHECK(norm.weights()[0].value.shape() == Shape{3, 4});
    CHECK(norm.weights()[1].name == "beta");
    const json config = norm.get_config();
    CHECK(config["axis"] == json::parse("[1, 2]"));
    CHECK(config["gamma_initializer"] == json::parse(R"({"class_name": "Ones", "config": {}})"));
    CHECK(ZeroPadding2D({1, 2}, {.name = "z"}).get_config()["padding"] ==
          json::parse("[[1, 1], [2, 2]]"));
    CHECK(UpSampling2D(2, {.name = "u"}).get_config() ==
          json::parse(R"({"name": "u", "trainable": true, "dtype": "float32", "size": [2, 2],
              "data_format": "channels_last", "interpolation": "nearest"})"));
    CHECK(Permute({2, 1}, {.name = "p"}).get_config()["dims"] == json::parse("[2, 1]"));
    CHECK(RepeatVector(3, {.name = "r"}).get_config()["n"] == 3);
    // tf.keras writes LayerNormalization's axis as an integer or a list.
    auto& registry = LayerRegistry::instance();
    CHECK(registry.create("LayerNormalization", {{"axis", -1}})->get_config()["axis"] ==
          json::parse("[-1]"));
  }

  TEST_CASE("The shape merge and normalisation layers name themselves in errors") {
    Subtract subtract({.name = "s"});
    const Shape three[] = {Shape{2}, Shape{2}, Shape{2}};
    CHECK_THROWS_WITH_AS(subtract.build(three, 0),
                         "subtract layer 's': expects exactly 2 inputs but got 3", ShapeError);
    Multiply multiply({.name = "m"});
    const Shape one[] = {Shape{2}};
    CHECK_THROWS_WITH_AS(multiply.build(one, 0),
                         "multiply layer 'm': expects at least 2 inputs but got 1", ShapeError);
    Maximum maximum({.name = "mx"});
    const Shape different[] = {Shape{2, 3}, Shape{3, 2}};
    CHECK_THROWS_WITH_AS(maximum.build(different, 0),
                         "maximum layer 'mx': inputs must have the same shape or broadcast but got "
                         "(None, 2, 3) and (None, 3, 2)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(Permute({1, 3}, {.name = "p"}),
                         "permute layer 'p': dims must be a permutation of 1..2 but is (1, 3)",
                         ConfigError);
    Permute permute({2, 1}, {.name = "p2"});
    const Shape rank3[] = {Shape{2, 3, 4}};
    CHECK_THROWS_WITH_AS(permute.build(rank3, 0),
                         "permute layer 'p2': dims (2, 1) permute rank-2 inputs but got (2, 3, 4)",
                         ShapeError);
    RepeatVector repeat(2, {.name = "r"});
    CHECK_THROWS_WITH_AS(repeat.build(rank3, 0),
                         "repeat_vector layer 'r': expects rank-1 inputs (without the batch axis) "
                         "but got (2, 3, 4)",
                         ShapeError);
    LayerNormalization norm({.axis = {3}, .name = "ln"});
    const Shape rank2[] = {Shape{3, 4}};
    CHECK_THROWS_WITH_AS(norm.build(rank2, 0),
                         "layer_normalization layer 'ln': axis 3 is not a distinct axis of a "
                         "sample of inputs of shape (None, 3, 4)",
                         ShapeError);
    LayerNormalization batch_axis({.axis = {0}, .name = "ln0"});
    CHECK_THROWS_AS(batch_axis.build(rank2, 0), ShapeError);
    CHECK_THROWS_WITH_AS(UpSampling2D(2, {.interpolation = "gaussian", .name = "u"}),
                         "up_sampling2d layer 'u': interpolation must be \"bilinear\", "
                         "\"nearest\", \"bicubic\", \"lanczos3\", \"lanczos5\" or \"area\" but "
                         "is \"gaussian\"",
                         ConfigError);
    // Keras lowercases UpSampling2D's interpolation.
    CHECK(UpSampling2D(2, {.interpolation = "BiCubic"}).get_config()["interpolation"] == "bicubic");
    ZeroPadding2D pad(1, {.name = "z"});
    CHECK_THROWS_WITH_AS(pad.build(rank2, 0),
                         "zero_padding2d layer 'z': expects rank-3 inputs (without the batch "
                         "axis) but got (3, 4)",
                         ShapeError);
    auto& registry = LayerRegistry::instance();
    CHECK_THROWS_WITH_AS(registry.create("ZeroPadding2D", {{"name", "z"}, {"padding", {1, 2, 3}}}),
                         "layer 'z' (ZeroPadding2D): config.padding: expected a non-negative "
                         "integer, a pair of them or a pair of pairs ((top, bottom), (left, "
                         "right)) but found [1,2,3]",
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("Permute", {{"name", "p"}, {"dims", {1, 1}}}),
                         "layer 'p' (Permute): config.dims: expected a permutation of 1..rank but "
                         "found [1,1]",
                         ConfigError);
    CHECK_THROWS_WITH_AS(registry.create("RepeatVector", {{"name", "r"}}),
                         "layer 'r' (RepeatVector): config.n: expected a positive integer but "
                         "found nothing",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("LayerNormalization", {{"name", "n"}, {"axis", "last"}}),
        "layer 'n' (LayerNormalization): config.axis: expected an integer or a list of integers "
        "but found \"last\"",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        registry.create("UpSampling2D", {{"name", "u"}, {"interpolation", "gaussian"}}),
        "layer 'u' (UpSampling2D): config.interpolation: expected \"nearest\", \"bilinear\", "
        "\"bicubic\", \"lanczos3\", \"lanczos5\" or \"area\" but found \"gaussian\"",
        ConfigError);
  }

  TEST_CASE("Maximum and Minimum send a tie's gradient to the first input as TensorFlow does") {
    CpuBackend backend;
    Maximum maximum({.name = "mx"});
    Minimum minimum({.name = "mn"});
    const Shape in[] = {Shape{2}, Shape{2}, Shape{2}};
    maximum.build(in, 0);
    minimum.build(in, 0);
    const std::vector<Tensor<float>> x{Tensor<float>({1, 2}, {1.0F, 0.0F}),
                                       Tensor<float>({1, 2}, {1.0F, 2.0F}),
                                       Tensor<float>({1, 2}, {1.0F, 2.0F})};
    const Tensor<float> dy({1, 2}, {3.0F, 5.0F});
    const CallContext ctx{.backend = backend};
    Tensor<float> y({1, 2});
    std::vector<Tensor<float>> dx{Tensor<float>({1, 2}), Tensor<float>({1, 2}),
                                  Tensor<float>({1, 2})};
    maximum.forward(x, y, ctx);
    CHECK(y == Tensor<float>({1, 2}, {1.0F, 2.0F}));
    maximum.backward(x, y, dy, dx, ctx);
    CHECK(dx[0] == Tensor<float>({1, 2}, {3.0F, 0.0F}));
    CHECK(dx[1] == Tensor<float>({1, 2}, {0.0F, 5.0F}));
    CHECK(dx[2] == Tensor<float>({1, 2}, {0.0F, 0.0F}));
    minimum.forward(x, y, ctx);
    CHECK(y == Tensor<float>({1, 2}, {1.0F, 0.0F}));
    minimum.backward(x, y, dy, dx, ctx);
    CHECK(dx[0] == Tensor<float>({1, 2}, {3.0F, 5.0F}));
    CHECK(dx[1] == Tensor<float>({1, 2}, {0.0F, 0.0F}));
  }

  TEST_CASE("Keras files with Conv1D and mixed data formats predict as PyTorch on their weights") {
    const char* shared = std::getenv("LOADSTAR_SHARED_DIR");
    REQUIRE_MESSAGE(shared != nullptr, "LOADSTAR_SHARED_DIR is not set");
    const json& models = merge_reference()["models"];
    CHECK(models.size() == 2);
    for (const auto& m : models) {
      const std::string file = m["file"];
      INFO(file);
      const auto path = std::filesystem::path(shared) / "fixtures" / "keras" / file;
      if (!std::filesystem::exists(path)) {
        MESSAGE("skipped: " << path.string() << " is missing");
        continue;
      }
      auto model = model_from_json(h5_string_attribute(path, "model_config"));
      model->set_weights(keras_file_weights(path, *model));
      const Tensor<float> x =
          layer_cases::tensor_of(m["input"], layer_cases::shape_of(m["input_shape"]));
      const Tensor<float> y = model->predict(x, {.verbose = 0});
      CHECK(y.shape() == layer_cases::shape_of(m["output_shape"]));
      layer_cases::check_close("prediction", y, m["output"]);
    }
  }
}
